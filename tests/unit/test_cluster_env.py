"""What every Ray worker's environment holds (d3ray/cluster.py): the driver's Hugging Face, tracker, NCCL and
AWS variables pass through, ``ray.env_vars`` adds to them and wins, and a submitted job's own runtime-env
variables are not named again (Ray refuses a driver runtime_env that repeats one)."""

from __future__ import annotations

import json

from d3ray.cluster import job_env_vars, passthrough_env, worker_env
from d3ray.config import RunConfig
from d3ray.config_loading import load_config

DRIVER = {"HF_HOME": "/models/hf", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline",
          "MLFLOW_TRACKING_URI": "file:/tmp/ml", "NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "eth0",
          "AWS_REGION": "us-east-1", "PATH": "/usr/bin", "HOME": "/root", "CUDA_VISIBLE_DEVICES": "0",
          "RAY_ADDRESS": "auto", "MY_HF_HOME": "/no"}


def test_cluster_passthrough_env_selects_hf_trackers_nccl_aws_only():
    assert passthrough_env(DRIVER) == {
        "AWS_REGION": "us-east-1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": "/models/hf",
        "MLFLOW_TRACKING_URI": "file:/tmp/ml", "NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "eth0",
        "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline"}


def test_cluster_worker_env_config_env_vars_add_and_win_over_the_driver():
    cfg = load_config(RunConfig, None, ["--ray.env_vars={NCCL_DEBUG: WARN, MY_FLAG: '1'}"])
    env = worker_env(cfg, DRIVER)
    assert env["NCCL_DEBUG"] == "WARN" and env["MY_FLAG"] == "1"
    assert env["HF_HOME"] == "/models/hf" and env["WANDB_MODE"] == "offline"
    assert "PATH" not in env and "CUDA_VISIBLE_DEVICES" not in env and "RAY_ADDRESS" not in env
    assert env["DS_ACCELERATOR"] == "cpu"  # d3ray's own settings stay


def test_cluster_job_env_vars_drops_the_submitted_jobs_own_variables():
    job = {"runtime_env": {"working_dir": "/src", "env_vars": {"HF_HOME": "/job/hf"}}}
    environ = {"RAY_JOB_CONFIG_JSON_ENV_VAR": json.dumps(job)}
    assert job_env_vars({"HF_HOME": "/job/hf", "NCCL_DEBUG": "INFO"}, environ) == {"NCCL_DEBUG": "INFO"}
    assert job_env_vars({"HF_HOME": "/x"}, {}) == {"HF_HOME": "/x"}  # not in a submitted job
