"""``setup.sh`` on bad ground: an unsupported Python and an unreachable registry each stop it with one line
that says which, and neither leaves an environment that looks complete (no ``ready`` line, d3ray not
importable). The good path (a fresh venv installed from the lock) is what CI runs first (``.ci/run``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import venv
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow


def setup_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_", "VIRTUAL_ENV"))}
    return env | extra


def run_setup(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(REPO / "setup.sh"), *args], env=env, capture_output=True, text=True,
                          timeout=600)


def errors(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.startswith("setup.sh:")]


def old_python() -> str | None:
    """A Python older than 3.11 on this machine (on the PATH, or one of pyenv's), if any."""
    pyenv = Path.home() / ".pyenv" / "versions"
    for version in ("3.10", "3.9"):
        candidates = [shutil.which(f"python{version}"), *(str(p / "bin" / "python") for p in pyenv.glob(f"{version}.*"))]
        for found in filter(None, candidates):
            if subprocess.run([found, "-c", "pass"], capture_output=True).returncode == 0:
                return found
    return None


def test_setup_refuses_python_older_than_3_11_in_one_line():
    python = old_python()
    if python is None:
        pytest.skip("no Python older than 3.11 on this machine")
    done = run_setup(setup_env(PYTHON=python))
    assert done.returncode == 2
    [line] = errors(done)
    assert line.startswith("setup.sh: d3ray needs Python >= 3.11; ") and "Set PYTHON=" in line
    assert "ready" not in done.stdout


def test_setup_with_an_unreachable_registry_stops_in_one_line_and_never_says_ready(tmp_path):
    target = tmp_path / "venv"
    venv.create(target, with_pip=True)
    python = target / "bin" / "python"
    closed = "http://127.0.0.1:9/simple"  # the discard port: nothing listens, the connection is refused at once
    env = setup_env(PYTHON=str(python), PIP_CONFIG_FILE=os.devnull, PIP_INDEX_URL=closed, PIP_RETRIES="0",
                    PIP_TIMEOUT="5", UV_INDEX_URL=closed, UV_NO_CACHE="1", UV_HTTP_TIMEOUT="5",
                    D3RAY_TORCH_INDEX=closed, PATH=f"{target / 'bin'}:{os.environ['PATH']}")
    done = run_setup(env)
    assert done.returncode != 0
    [line] = errors(done)
    assert line.startswith(f"setup.sh: torch 2.13.0 from D3RAY_TORCH_INDEX={closed} failed"), line
    assert "full log:" in line
    assert "ready" not in done.stdout
    outside = subprocess.run([str(python), "-c", "import d3ray"], capture_output=True, cwd=tmp_path)
    assert outside.returncode != 0, "d3ray is not installed in the venv"
