"""Export the install targets' requirement files from uv.lock, or check that they are current.

    python requirements/export.py            # after `uv lock`: rewrite requirements/*.txt
    python requirements/export.py --check    # CI: uv.lock matches pyproject.toml, the files match uv.lock

uv.lock is the one pin list; each file here is a view of it, with hashes, for one target:

  cpu.txt       Linux, CPU: the runtime set less torch and the CUDA libraries (setup.sh installs torch's
                CPU build first, then this file)
  cpu-dev.txt   the same with the test tools and every optional extra but flash (`setup.sh --dev`)
  node.txt      cluster nodes and the image (Dockerfile, cluster.yaml, cluster-gcp.yaml, k8s/): the runtime
                set with the cloud extra, less torch and the CUDA libraries: they install the lock's torch
                version from PyTorch's CUDA 12.8 index first (NVIDIA driver >= 570)
  gpu.txt       a GPU box set up by setup.sh: the runtime set and the cloud extra with the lock's torch
                2.13.0 and the CUDA libraries PyPI's build of it pulls in (CUDA 13: driver >= 580)

Each file holds markers for Python 3.11 and 3.12 alike (the lock is universal over Python versions).
Standard library only: it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import difflib
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HERE = ROOT / "requirements"
REFRESH = "uv lock && python requirements/export.py"
CUDA_ONLY = re.compile(r"^(nvidia-|cuda-|triton$)")  # torch's dependencies that its CPU build does not declare


def cuda_roots(lock_path: Path) -> list[str]:
    """The CUDA packages torch pulls in on Linux: pruned (with what only they need) from the CPU files."""
    lock = tomllib.loads(lock_path.read_text())
    torch = next(p for p in lock["package"] if p["name"] == "torch")
    return sorted({d["name"] for d in torch.get("dependencies", []) if CUDA_ONLY.match(d["name"])})


def targets(lock_path: Path) -> dict[str, list[str]]:
    prune = [arg for name in cuda_roots(lock_path) for arg in ("--prune", name)]
    cpu = ["--no-emit-package", "torch", *prune]
    return {
        "cpu.txt": cpu,
        "cpu-dev.txt": [*cpu, "--extra", "dev"],
        "node.txt": [*cpu, "--extra", "cloud"],
        "gpu.txt": ["--extra", "cloud"],
    }


def export(out_dir: Path, uv: str) -> None:
    for name, args in targets(ROOT / "uv.lock").items():
        header = f"# d3ray requirements/{name}: exported from uv.lock by `{REFRESH}`; do not edit\n"
        result = subprocess.run(
            [uv, "export", "--frozen", "--no-emit-project", "--no-header", "--quiet", *args],
            cwd=ROOT, check=True, capture_output=True, text=True,
        )
        (out_dir / name).write_text(header + result.stdout)


def check(uv: str) -> int:
    locked = subprocess.run([uv, "lock", "--check", "--quiet"], cwd=ROOT, capture_output=True, text=True)
    if locked.returncode != 0:
        print(f"uv.lock does not match pyproject.toml: run `{REFRESH}` and commit both", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        export(Path(tmp), uv)
        stale = []
        for name in targets(ROOT / "uv.lock"):
            committed = (HERE / name).read_text() if (HERE / name).exists() else ""
            fresh = (Path(tmp) / name).read_text()
            if committed != fresh:
                stale.append(name)
                sys.stderr.writelines(list(difflib.unified_diff(
                    committed.splitlines(True), fresh.splitlines(True), f"committed/{name}", f"uv.lock/{name}"))[:20])
    if stale:
        print(f"requirements/{', '.join(stale)} do not match uv.lock: run `{REFRESH}` and commit them", file=sys.stderr)
        return 1
    print("uv.lock matches pyproject.toml; requirements/*.txt match uv.lock")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail (exit 1) if uv.lock or a file here is stale")
    args = parser.parse_args()
    uv = shutil.which("uv")
    if uv is None:
        print("requirements/export.py needs uv: pip install uv", file=sys.stderr)
        return 2
    if args.check:
        return check(uv)
    export(HERE, uv)
    print(f"wrote {', '.join(targets(ROOT / 'uv.lock'))} in requirements/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
