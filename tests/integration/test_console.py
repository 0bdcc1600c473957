"""What a user sees: the default run's console holds where the run lives, progress lines, eval lines
and the final table with the schedule's figures; no Python warnings and no metric-dict dumps (all
of that goes to the run directory's logs)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import make_corpus

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.own_ray]


def test_default_d3_run_console_is_progress_eval_and_summary_only(tmp_path) -> None:
    import ray

    ray.shutdown()  # the CLI starts its own local instance; one Ray instance on the box at a time
    data_dir, tokenizer = make_corpus(tmp_path, seed=4, train_docs=300, validation_docs=70, train_shards=2)
    out = subprocess.run(
        [sys.executable, "-m", "d3ray", "pretrain", f"--output_dir={tmp_path / 'runs'}", "--train.steps=16",
         "--train.log_every=8", "--schedule.L=4", f"--data.train_paths=[{data_dir / 'train'}]",
         f"--data.validation_paths=[{data_dir / 'validation'}]", f"--data.tokenizer.path={tokenizer}",
         "--data.seq_len=64", "--eval.max_sequences_per_domain=2", "--ray.num_cpus=4"],
        capture_output=True, text=True, timeout=900,
    )
    console = out.stdout + out.stderr
    assert out.returncode == 0, console[-3000:]
    assert re.search(r"^run d3ray-tiny: d3 schedule, 16 steps, in .*runs/d3ray-tiny", out.stdout, re.M)
    assert "step 8/16 | loss" in console and "step 16/16 | loss" in console
    assert "eval step 16 | mean loss" in console
    assert re.search(r"^schedule: 4 chunks decided, \d+ fallbacks, trainer wait", out.stdout, re.M)
    assert "finished 16 steps" in out.stdout
    for noise in ("Warning:", "Reporting training result", "metrics={", "Traceback", "loss_type=None"):
        assert noise not in console, f"{noise!r} on the console:\n{console[-3000:]}"
    logs = tmp_path / "runs" / "d3ray-tiny" / "logs"
    assert {"driver.log", "coordinator.log", "trainer-0.log", "trainer-1.log", "influence-0.log"} <= {
        p.name for p in logs.iterdir()}
    assert "FutureWarning" in (logs / "trainer-0.log").read_text(), "library warnings are kept in the run's logs"
