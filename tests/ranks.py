"""A script run as W gloo ranks on this machine, one process per rank (the multi-rank DeepSpeed tests).

Each rank gets ``MASTER_ADDR``/``MASTER_PORT``/``RANK``/``WORLD_SIZE``/``LOCAL_RANK``, ``DS_ACCELERATOR=cpu``
and the repository on ``PYTHONPATH``, runs in ``cwd``, and reports by printing ``<TAG> <json>`` lines (:func:`reported`).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(script: str, cwd: Path, world: int = 2, timeout_s: float = 600) -> list[str]:
    """Run ``script`` as ``world`` ranks; every rank must exit 0 (else their stderr tails are the message).
    Returns each rank's stdout."""
    port = str(free_port())
    procs = []
    for rank in range(world):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(rank), WORLD_SIZE=str(world),
                   LOCAL_RANK=str(rank), DS_ACCELERATOR="cpu", PYTHONPATH=str(REPO))
        procs.append(subprocess.Popen([sys.executable, "-c", script], env=env, cwd=cwd, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    outs = [p.communicate(timeout=timeout_s) for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(err[-3000:] for _, err in outs)
    return [stdout for stdout, _ in outs]


def reported(stdout: str, tag: str = "RESULT") -> Any:
    """The JSON of the last ``<tag> <json>`` line a rank printed."""
    lines = [ln for ln in stdout.splitlines() if ln.startswith(f"{tag} ")]
    assert lines, f"no {tag} line in:\n{stdout[-3000:]}"
    return json.loads(lines[-1][len(tag) + 1:])
