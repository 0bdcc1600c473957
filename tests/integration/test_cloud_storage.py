"""Cloud storage for real: the corpus read from ``s3://`` and Ray Train checkpoints written to an ``s3://``
``storage_path``, against a real S3-compatible server on the loopback address, and a killed run resumed
from its S3 checkpoint exactly once.

The server is moto's server mode (``moto[server]``, from the ``dev`` extra): it stands in for the cloud
provider itself, which cannot exist here. Nothing of d3ray is faked. Every client reaches it the way a
MinIO or on-prem S3 user would point d3ray at theirs: the AWS SDKs' own ``AWS_ENDPOINT_URL``, honoured
by s3fs/botocore (data, through fsspec) and by pyarrow's S3FileSystem (Ray Train's checkpoint storage),
set before Ray starts so that every Ray process inherits it. Only 127.0.0.1 is contacted (the EC2
metadata lookup is off, and the credentials are moto's ``testing`` pair from no file).

No ``gs://`` counterpart: no GCS server installs from a package registry (fake-gcs-server is a Go binary).
"""

from __future__ import annotations

import json

import pytest

from d3ray.config import RunConfig
from d3ray.config_loading import load_config
from d3ray.faults import FaultPlan, write_plan
from d3ray.run_files import read_jsonl
from tests.conftest import make_corpus, start_local_ray

pytest.importorskip("moto.server", reason="moto[server] is not installed (pip install -e '.[dev]')")
pytest.importorskip("s3fs", reason="s3fs is not installed (pip install -e '.[cloud]')")

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.own_ray]

BUCKET = "d3ray-test"
STEPS = 16  # 2 chunks of L=8 steps; a checkpoint after each chunk


@pytest.fixture
def s3_server(moto_s3, monkeypatch):
    """The loopback moto S3 server (``moto_s3``), with the shared Ray instance stopped: the instance started
    next inherits this environment."""
    import ray

    ray.shutdown()
    # Ray Train's controller (started by the Ray instance below) polls the workers this often
    monkeypatch.setenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.05")
    try:
        yield moto_s3
    finally:
        ray.shutdown()  # the next Ray test restarts the shared instance, without this environment


def trained_samples(run_dir):
    rows = [r for r in read_jsonl(run_dir / "samples.jsonl") if "sample_ids" in r]
    assert [r["step"] for r in rows] == list(range(1, len(rows) + 1)), "one row per step, no gaps or repeats"
    return [sid for r in rows for sid in r["sample_ids"]]


def step_rows(run_dir):
    return {r["step"]: r for r in read_jsonl(run_dir / "metrics.jsonl") if "train/loss" in r}


def test_cloud_storage_s3_data_and_checkpoints_kill_resume_trains_each_sample_once(s3_server, tmp_path):
    import boto3
    import fsspec

    from d3ray.run.pretrain import run_pretrain

    boto3.client("s3").create_bucket(Bucket=BUCKET)
    data_dir, tokenizer = make_corpus(tmp_path / "corpus", seed=3, train_docs=300, validation_docs=30,
                                      train_shards=2)
    s3 = fsspec.filesystem("s3")
    s3.put(str(data_dir) + "/", f"{BUCKET}/corpus/", recursive=True)
    assert s3.find(f"{BUCKET}/corpus/train"), "the corpus is on the S3 server"

    start_local_ray()  # after the environment is set: Ray Data's read tasks and the trainers inherit it
    args = [
        "--name=cloud", f"--output_dir={tmp_path / 'runs'}", f"--storage_path=s3://{BUCKET}/ckpt",
        f"--data.train_paths=[s3://{BUCKET}/corpus/train]", f"--data.validation_paths=[s3://{BUCKET}/corpus/validation]",
        f"--data.tokenizer.path={tokenizer}", "--data.seq_len=64",
        f"--train.steps={STEPS}", "--train.global_batch_size=8", "--train.micro_batch_size=8",
        "--train.num_workers=1", "--train.warmup_steps=2", "--train.eval_every=0", "--train.log_every=4",
        "--train.checkpoint_every_chunks=1", "--schedule.type=random", "--schedule.L=8",
        # the controller collects a report (and so registers its checkpoint) at its next poll: poll often, and
        # upload synchronously (the step waits for the upload), so that the kill 7 steps after the checkpoint
        # comes well after it is registered; with the async default a loaded box can kill the trainer while the
        # upload is still on its way, and the resume then rightly starts from scratch (async kill-and-resume:
        # tests/integration/test_finetune.py)
        "--ray.health_check_interval_s=0.05", "--train.checkpoint_upload=sync",
        "--eval.max_sequences_per_domain=2",
    ]
    cfg = load_config(RunConfig, None, [*args, "--train.max_failures=0"])
    write_plan(cfg.run_dir, FaultPlan(trainer_exit_at_step=15))  # killed in chunk 1, after chunk 0's checkpoint
    from ray.train import WorkerGroupError

    with pytest.raises(WorkerGroupError):
        run_pretrain(cfg)
    killed_rows = step_rows(cfg.run_dir)
    killed_samples = trained_samples(cfg.run_dir)
    assert max(killed_rows) == 15  # rank 0 exits after logging step 15
    states = [json.loads(s3.cat_file(path)) for path in s3.glob(f"{BUCKET}/ckpt/cloud/checkpoint_*/state.json")]
    assert [state["step"] for state in states] == [8], "chunk 0's checkpoint, on the S3 server"
    assert not list(cfg.run_dir.glob("checkpoint_*")), "no checkpoint on the local disk"

    (cfg.run_dir / "faults.json").unlink()
    final = run_pretrain(load_config(RunConfig, None, args))
    assert final["steps"] == STEPS
    assert final["checkpoint"].startswith(f"{BUCKET}/ckpt/cloud/checkpoint_") or \
        final["checkpoint"].startswith(f"s3://{BUCKET}/ckpt/cloud/checkpoint_")
    # The latest pointer sits beside the checkpoints on S3 (written by the Ray Train controller).
    assert s3.cat_file(f"{BUCKET}/ckpt/cloud/latest").decode().strip() == final["checkpoint"].rstrip("/").split("/")[-1]
    rows = step_rows(cfg.run_dir)
    assert sorted(rows) == list(range(1, STEPS + 1))
    # resumed at step 9 from the S3 checkpoint: steps 1-8 keep the killed run's own rows (their measured
    # step times; a run restarted from scratch would have rewritten them) and steps 9-15 were trained again
    assert [rows[s] for s in range(1, 9)] == [killed_rows[s] for s in range(1, 9)]
    assert all(rows[s]["time/step_sec"] != killed_rows[s]["time/step_sec"] for s in range(9, 16))
    samples = trained_samples(cfg.run_dir)
    assert len(samples) == len(set(samples)) == STEPS * 8, "every trained sample exactly once"
    assert samples[: 15 * 8] == killed_samples, "the resumed run picks the data up where the checkpoint left it"
    quality = json.loads((cfg.run_dir / "data_quality.json").read_text())
    assert quality["data_quality"]["total_bad"] == 0
