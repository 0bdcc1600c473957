"""A 2-trial Ray Tune sweep of the tiny config on a real local Ray: each trial a whole training run
(TorchTrainer + DeepSpeed on CPU) driven by a Tune function trainable, ASHA on validation loss.

The sweep must write its results table and best config, put each trial's run directory (named
with the trial id) under the sweep directory, and a second invocation must restore the finished
sweep from its Tune state instead of training again.
"""

from __future__ import annotations

import csv
import json

import pytest

from d3ray.config import RunConfig
from d3ray.config_loading import load_config
from d3ray.run_files import read_jsonl
from d3ray.tune.config import SweepConfig
from tests.conftest import REPO, make_corpus

pytestmark = [pytest.mark.ray, pytest.mark.slow]

STEPS = 8


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A small generated corpus and its tokenizer, shared by the trials (no per-trial BPE training)."""
    return make_corpus(tmp_path_factory.mktemp("sweep_corpus"), seed=3, train_docs=300, validation_docs=70,
                       train_shards=2)


def tiny_sweep(corpus, storage) -> SweepConfig:
    data_dir, tokenizer = corpus
    return load_config(
        SweepConfig,
        REPO / "tune_configs" / "tiny.yaml",
        [
            f"--storage_path={storage}",
            "--max_concurrent_trials=1",
            "--scheduler.grace_period=4",
            f"--space.train.steps={STEPS}",
            "--space.train.eval_every=4",
            "--space.train.num_workers=1",  # the Tune plumbing is under test, not data parallelism
            "--space.train.global_batch_size=4",
            "--space.train.micro_batch_size=4",
            "--space.schedule.L={grid: [4, 8]}",
            f"--space.data.train_paths=[{data_dir / 'train'}]",
            f"--space.data.validation_paths=[{data_dir / 'validation'}]",
            f"--space.data.tokenizer.path={tokenizer}",
            "--space.data.seq_len=64",
            "--space.eval.max_sequences_per_domain=2",
            "--space.train.log_every=8",
        ],
    )


def test_sweep_two_trials_tiny_writes_results_and_best_config_and_restores(ray_cluster, corpus, tmp_path):
    from d3ray.tune.sweep import run_sweep

    sweep = tiny_sweep(corpus, tmp_path)
    outcome = run_sweep(sweep)

    sweep_dir = tmp_path / "tiny"
    assert outcome.sweep_dir == str(sweep_dir)
    assert len(outcome.rows) == 2
    assert {row.params["schedule.L"] for row in outcome.rows} == {4, 8}
    for row in outcome.rows:
        assert row.status == "completed", row.error
        assert row.step == STEPS and row.metric is not None
        run_dir = sweep_dir / "runs" / f"tiny-{row.trial_id}"
        assert row.cfg.run_dir == run_dir and run_dir.is_dir()
        steps = [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl") if "train/loss" in r]
        assert steps == list(range(1, STEPS + 1))
        final = json.loads((run_dir / "final_metrics.json").read_text())  # the run finished its bookkeeping
        assert final["eval/mean_loss"] == row.metric and row.extras["final_loss"] == final["final_loss"]

    with open(sweep_dir / "results.csv") as fh:
        table = list(csv.DictReader(fh))
    assert len(table) == 2
    assert {r["trial_id"] for r in table} == {row.trial_id for row in outcome.rows}
    assert {r["schedule.L"] for r in table} == {"4", "8"}
    losses = [float(r["eval/mean_loss"]) for r in table]
    assert losses == sorted(losses), "best trial first"

    best = load_config(RunConfig, sweep_dir / "best_config.yaml")
    assert outcome.best is not None and best.schedule.L == outcome.best.params["schedule.L"]
    assert best.name == "tiny-best" and best.train.steps == STEPS

    again = run_sweep(sweep, resume=True)  # a finished sweep is restored, not trained again
    assert {r.trial_id for r in again.rows} == {r.trial_id for r in outcome.rows}
    assert [r.metric for r in again.rows] == [r.metric for r in outcome.rows]
