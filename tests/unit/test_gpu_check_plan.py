"""``bench/gpu_check.sh``: its plan loads every step's config through d3ray's loader and preflight (a config
error fails here, not on the lent GPU), and the script stops at the first step it cannot run.

The full ``--dry-run`` (the same five steps on the CPU, tiny settings) starts Ray several times and takes
about 7 minutes on the 2-core box (419 s, 2026-12-02), so it is not run in the suite; ``--plan`` runs nothing and takes seconds.
"""

from __future__ import annotations

import os
import subprocess

from tests.conftest import REPO

SCRIPT = REPO / "bench" / "gpu_check.sh"
STEPS = ("d3-actors", "d3-in-trainer", "influence", "pipeline", "capacity")


def run_script(tmp_path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OUT": str(tmp_path / "out"), **env})


def test_gpu_check_plan_two_gpus_loads_every_config_and_plans_two_ranks(tmp_path):
    done = run_script(tmp_path, "--plan", NGPU="2")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.count("config ok:") == 3
    assert "gpt2-124m, 2 ranks x 0.75 GPU, ZeRO-3" in out
    assert [line.split()[1] for line in out.splitlines() if line.startswith("== ")] == list(STEPS)
    assert "--train.eval_every=16" in out and "--device cuda" in out
    assert not (tmp_path / "out" / "gpu-d3").exists(), "a plan runs nothing"


def test_gpu_check_spent_budget_stops_at_the_first_step(tmp_path):
    done = run_script(tmp_path, "--dry-run", BUDGET_S="0")
    assert done.returncode == 1
    assert "FAILED: the 0s budget is spent before step 'd3-actors'" in done.stderr
    assert "== d3-in-trainer" not in done.stdout and "summary" not in done.stdout
