"""The lock (uv.lock) and its exports (requirements/*.txt): a stale one fails ``requirements/export.py --check``
in one line naming the command that refreshes it; the exports hold what each install target needs."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.lockfile import exported_pins, locked_versions

REFRESH = "uv lock && python requirements/export.py"
needs_uv = pytest.mark.skipif(shutil.which("uv") is None, reason="uv is not on the PATH (setup.sh installs it)")


def checkout_copy(tmp_path):
    """The files the check reads, in a folder of their own (never the repository's own)."""
    for name in ("pyproject.toml", "uv.lock", "README.md"):
        shutil.copy(REPO / name, tmp_path / name)
    shutil.copytree(REPO / "requirements", tmp_path / "requirements")
    (tmp_path / "d3ray").mkdir()
    (tmp_path / "d3ray" / "__init__.py").write_text('__version__ = "0.1.0"\n')
    return tmp_path


def check(root):
    return subprocess.run([sys.executable, "requirements/export.py", "--check"], cwd=root,
                          capture_output=True, text=True, timeout=300)


def test_lock_exports_pin_torch_only_where_it_belongs():
    assert locked_versions()["torch"] == "2.13.0"
    for cpu in ("cpu.txt", "cpu-dev.txt", "node.txt"):
        pins = exported_pins(cpu)
        assert "torch" not in pins and not any(p.startswith(("nvidia-", "cuda-")) or p == "triton" for p in pins), cpu
        assert pins["ray"] == locked_versions()["ray"] and "sympy" in pins  # torch's CPU dependencies stay pinned
    gpu = exported_pins("gpu.txt")
    assert gpu["torch"] == "2.13.0" and any(p.startswith("nvidia-") for p in gpu)
    assert "pytest" in exported_pins("cpu-dev.txt") and "pytest" not in exported_pins("cpu.txt")
    assert "s3fs" in exported_pins("node.txt") and "s3fs" not in exported_pins("cpu.txt")


@needs_uv
def test_lock_check_passes_on_the_repository_and_names_the_refresh_for_a_stale_export(tmp_path):
    root = checkout_copy(tmp_path)
    assert check(root).returncode == 0
    with (root / "requirements" / "cpu.txt").open("a") as f:
        f.write("six==1.16.0\n")
    stale = check(root)
    assert stale.returncode == 1
    assert stale.stderr.strip().splitlines()[-1] == (
        f"requirements/cpu.txt do not match uv.lock: run `{REFRESH}` and commit them")


@needs_uv
def test_lock_check_fails_when_pyproject_changes_without_a_relock(tmp_path):
    root = checkout_copy(tmp_path)
    pyproject = root / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('"numpy>=2.0",', '"numpy>=2.0",\n    "six>=1.16",'))
    stale = check(root)
    assert stale.returncode == 1
    assert stale.stderr.strip().splitlines() == [
        f"uv.lock does not match pyproject.toml: run `{REFRESH}` and commit both"]
