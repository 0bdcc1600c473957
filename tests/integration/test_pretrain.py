"""End to end on a real local Ray: Ray Data → coordinator → Ray Train + DeepSpeed ZeRO-2 on CPU.

One uninterrupted run (its loss must fall), then the same run checkpointing every 2 chunks
(``train.checkpoint_every_chunks=2``), killed 1.5 chunks after its last checkpoint (rank 0 exits at a
step, no retries), and re-run under the same name: it must resume from that checkpoint's data position,
train the chunks after it again, and end having trained exactly the samples the uninterrupted run
trained, in the same order, with its loss curve.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from d3ray.config import RunConfig
from d3ray.config_loading import load_config
from d3ray.faults import FaultPlan, write_plan
from d3ray.run_files import read_jsonl
from tests.conftest import make_corpus

pytestmark = [pytest.mark.ray, pytest.mark.slow]

STEPS = 24


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A generated SlimPajama-format corpus and a tokenizer trained on it, shared by both runs."""
    return make_corpus(tmp_path_factory.mktemp("corpus"), seed=1, train_docs=700, validation_docs=70, train_shards=3)


def run_config(corpus, out, name, *extra):
    data_dir, tokenizer = corpus
    return load_config(RunConfig, None, [
        f"--name={name}", f"--output_dir={out}",
        f"--data.train_paths=[{data_dir / 'train'}]", f"--data.validation_paths=[{data_dir / 'validation'}]",
        f"--data.tokenizer.path={tokenizer}", "--data.seq_len=64",
        f"--train.steps={STEPS}", "--train.global_batch_size=8", "--train.micro_batch_size=2",
        "--train.num_workers=2", "--train.zero_stage=2", "--train.warmup_steps=4", "--train.eval_every=0",
        "--train.log_every=8", "--schedule.type=random", "--schedule.L=4", "--eval.max_sequences_per_domain=4",
        *extra,
    ])


def losses_by_step(run_dir):
    return {r["step"]: r["train/loss"] for r in read_jsonl(run_dir / "metrics.jsonl") if "train/loss" in r}


def trained_samples(run_dir):
    rows = [r for r in read_jsonl(run_dir / "samples.jsonl") if "sample_ids" in r]
    assert [r["step"] for r in rows] == list(range(1, len(rows) + 1)), "one row per step, no gaps or repeats"
    return [sid for r in rows for sid in r["sample_ids"]]


def test_pretrain_zero2_two_workers_loss_falls_and_kill_resume_matches(ray_cluster, corpus, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    from d3ray.run.pretrain import run_pretrain

    # 1. uninterrupted reference run, also reported to W&B (offline) and MLflow (a file store): the trackers'
    # variables are set in this driver only, after the shared Ray instance started, so the rank-0 worker
    # sees them only through d3ray's pass-through (d3ray/run/cluster.py: worker_env)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_dir"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # this process reads the store below
    (tmp_path / "wandb_dir").mkdir()
    ref_cfg = run_config(corpus, tmp_path, "reference", "--train.report_to=[tensorboard,wandb,mlflow]",
                         # sized to what the trainers leave (the killed run: 1 tokenizer, set); 2 CPUs each, so that
                         # the 2 real cores are not shared by more tokenizers than the killed run has
                         "--data.tokenize_actors=0", "--data.tokenize_cpus=2")
    final = run_pretrain(ref_cfg)
    # the shared test cluster declares 4 CPUs; 2 trainers of 0.5 CPU; random order starts no actor: ⌊3 / 2⌋ = 1
    assert "data.tokenize_actors=0: 1 tokenizers (3.00 of 4.00 CPUs" in (ref_cfg.run_dir / "logs" / "driver.log").read_text()
    assert len(list((tmp_path / "wandb_dir").glob("wandb/offline-run-*/run-*.wandb"))) == 1
    client = MlflowClient((tmp_path / "mlruns").as_uri())
    [tracked] = client.search_runs([client.get_experiment_by_name("d3ray").experiment_id])
    assert [m.step for m in client.get_metric_history(tracked.info.run_id, "train.loss")] == list(range(1, STEPS + 1))
    assert tracked.data.metrics["eval.mean_loss"] == pytest.approx(final["eval/mean_loss"])
    ref_losses = losses_by_step(ref_cfg.run_dir)
    assert sorted(ref_losses) == list(range(1, STEPS + 1))
    first, last = np.mean([ref_losses[s] for s in (1, 2, 3)]), np.mean([ref_losses[s] for s in (22, 23, 24)])
    assert last < first - 1.0, f"loss did not fall: {first:.3f} → {last:.3f}"
    assert final["steps"] == STEPS and np.isfinite(final["eval/mean_loss"])
    assert any(k.startswith("eval/RedPajama") and k.endswith("/ppl") for k in final)
    ref_samples = trained_samples(ref_cfg.run_dir)
    assert len(ref_samples) == len(set(ref_samples)) == STEPS * 8

    # 2. same run, checkpoints every 2 chunks of 4 steps, killed at step 14 → the last one is at step 8
    # (checkpoint_every_sec set but never due: rank 0's time decision is broadcast at every chunk boundary)
    # (saved in place, the default for a local storage_path; the asynchronous upload: test_finetune.py)
    cadence = ["--train.checkpoint_every_chunks=2", "--train.checkpoint_every_sec=100000"]
    crash_cfg = run_config(corpus, tmp_path, "killed", "--train.max_failures=0", *cadence)
    write_plan(crash_cfg.run_dir, FaultPlan(trainer_exit_at_step=14))
    from ray.train import WorkerGroupError

    with pytest.raises(WorkerGroupError):
        run_pretrain(crash_cfg)
    partial = read_jsonl(crash_cfg.run_dir / "samples.jsonl")
    assert max(r["step"] for r in partial) == 14
    written = sorted(json.loads((d / "state.json").read_text())["step"]
                     for d in crash_cfg.run_dir.glob("checkpoint_*") if d.is_dir())
    assert written == [8], f"a checkpoint every 2 chunks: only step 8's before the kill, got {written}"

    # 3. re-run under the same name: resumes from the step-8 checkpoint, trains chunks 2 and 3 again
    (crash_cfg.run_dir / "faults.json").unlink()
    resumed = run_pretrain(run_config(corpus, tmp_path, "killed", *cadence))
    assert resumed["steps"] == STEPS
    assert trained_samples(crash_cfg.run_dir) == ref_samples
    crash_losses = losses_by_step(crash_cfg.run_dir)
    assert sorted(crash_losses) == list(range(1, STEPS + 1))
    np.testing.assert_allclose([crash_losses[s] for s in range(1, STEPS + 1)],
                               [ref_losses[s] for s in range(1, STEPS + 1)], rtol=1e-5, atol=1e-6)
    schedule = read_jsonl(crash_cfg.run_dir / "schedule_log.jsonl")
    assert [r["chunk_id"] for r in schedule] == list(range(STEPS // 4))
    # each checkpoint's time in its parts: the coordinator's state, rank 0's wait for rank 1, the save, the report
    saves = [r for r in read_jsonl(crash_cfg.run_dir / "metrics.jsonl") if "time/checkpoint_sec" in r]
    assert saves and all(r["time/checkpoint_arrival_sec"] >= 0 for r in saves)
    parts = ("state", "arrival", "save", "report")
    for r in saves:
        assert sum(r[f"time/checkpoint_{p}_sec"] for p in parts) == pytest.approx(r["time/checkpoint_sec"], rel=1e-6)
    quality = json.loads((crash_cfg.run_dir / "data_quality.json").read_text())
    assert quality["data_quality"]["total_bad"] == 0
