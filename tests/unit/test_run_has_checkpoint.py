"""``has_checkpoint``: a run resumes when Ray Train's storage holds a checkpoint of it, wherever
``storage_path`` points (then the driver publishes no initial weights: the trainers publish the
checkpoint's). On ``s3://`` it lists a real S3-compatible server: moto's server mode on 127.0.0.1, standing
in for the cloud provider (reached through ``AWS_ENDPOINT_URL``, as a MinIO or on-prem store would be)."""

from __future__ import annotations

from d3ray.config import RunConfig
from d3ray.train.run import has_checkpoint


def test_run_has_checkpoint_local_storage_path_only_this_runs_checkpoints(tmp_path):
    cfg = RunConfig(name="a", output_dir=str(tmp_path / "runs"), storage_path=str(tmp_path / "ckpt"))
    assert not has_checkpoint(cfg)
    (tmp_path / "ckpt" / "b" / "checkpoint_2026-12-02_10-00-00.000000").mkdir(parents=True)
    (tmp_path / "runs" / "a" / "checkpoint_2026-12-02_10-00-00.000000").mkdir(parents=True)
    (tmp_path / "ckpt" / "a").mkdir()
    (tmp_path / "ckpt" / "a" / "checkpoint_manager_snapshot.json").write_text("{}")  # Ray's, not a checkpoint
    assert not has_checkpoint(cfg), "another run's, one outside storage_path, Ray's snapshot file: none count"
    (tmp_path / "ckpt" / "a" / "checkpoint_2026-12-02_10-00-00.000000").mkdir(parents=True)
    assert has_checkpoint(cfg)
    assert has_checkpoint(RunConfig(name="a", output_dir=str(tmp_path / "runs")))  # default: the run dir


def test_run_has_checkpoint_s3_storage_path_lists_the_bucket(moto_s3, tmp_path):
    import boto3

    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="d3ray-ckpt")
    cfg = RunConfig(name="a", output_dir=str(tmp_path / "runs"), storage_path="s3://d3ray-ckpt/runs")
    assert not has_checkpoint(cfg), "nothing under s3://d3ray-ckpt/runs/a yet"
    s3.put_object(Bucket="d3ray-ckpt", Key="runs/ab/checkpoint_2026-12-02_10-00-00.000000/state.json", Body=b"{}")
    s3.put_object(Bucket="d3ray-ckpt", Key="runs/a/checkpoint_manager_snapshot.json", Body=b"{}")
    assert not has_checkpoint(cfg), "another run's checkpoint and Ray's snapshot file are no checkpoint"
    s3.put_object(Bucket="d3ray-ckpt", Key="runs/a/checkpoint_2026-12-02_10-00-00.000000/state.json", Body=b"{}")
    assert has_checkpoint(cfg)
