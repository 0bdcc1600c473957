"""What every Ray worker's environment holds (d3ray/run/cluster.py): the driver's Hugging Face, tracker, NCCL and
AWS variables pass through, ``ray.env_vars`` adds to them and wins, and a submitted job's own runtime-env
variables are not named again (Ray refuses a driver runtime_env that repeats one); and how many tokenizers
``data.tokenize_actors=0`` gives on a node."""

from __future__ import annotations

import dataclasses
import json

from d3ray.config import RunConfig
from d3ray.config_loading import load_config
from d3ray.run.cluster import job_env_vars, passthrough_env, worker_env

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


def test_tokenizers_sized_to_the_cpus_the_trainers_and_scheduler_leave():
    """``data.tokenize_actors=0`` on a 16-CPU GPU node: 2 trainers of 2 CPUs and D3's influence and solver
    actors reserve theirs; each tokenizer takes ``tokenize_cpus`` of the rest."""
    from d3ray.data.config import AUTO_TOKENIZE_MAX, auto_tokenize_actors
    from d3ray.run.cluster import size_tokenizers
    from d3ray.schedule.config import resources_total

    cfg = load_config(RunConfig, None, ["--data.tokenize_actors=0", "--train.num_workers=2", "--train.cpus_per_worker=2",
                                        "--train.global_batch_size=8", "--schedule.type=d3",
                                        "--schedule.placement.type=actors"])
    scheduler_cpus = resources_total(cfg.schedule.actor_requests())["CPU"]
    assert scheduler_cpus > 0
    # the no-argument D3 (the trainers compute the potential, the coordinator sorts it) reserves nothing
    plain = load_config(RunConfig, None, ["--data.tokenize_actors=0", "--train.num_workers=2", "--train.cpus_per_worker=2",
                                          "--train.global_batch_size=8"])
    assert plain.schedule.actor_requests() == [] and plain.schedule.placement.type_name == "in_trainer"
    assert size_tokenizers(plain, plain.data, cluster_cpus=16.0).tokenize_actors == 12
    sized = size_tokenizers(cfg, cfg.data, cluster_cpus=16.0)
    assert sized.tokenize_actors == int(16.0 - 4.0 - scheduler_cpus)  # tokenize_cpus = 1
    half = size_tokenizers(cfg, dataclasses.replace(cfg.data, tokenize_cpus=0.5), cluster_cpus=16.0)
    assert half.tokenize_actors == min(AUTO_TOKENIZE_MAX, int((16.0 - 4.0 - scheduler_cpus) / 0.5))
    # A 2-core box whose trainers hold every CPU still gets one tokenizer; a set value is kept.
    assert size_tokenizers(cfg, cfg.data, cluster_cpus=2.0).tokenize_actors == 1
    assert size_tokenizers(cfg, dataclasses.replace(cfg.data, tokenize_actors=3), cluster_cpus=64.0).tokenize_actors == 3
    assert [auto_tokenize_actors(free, 1.0) for free in (-1.0, 0.5, 3.9, 100.0)] == [1, 1, 3, AUTO_TOKENIZE_MAX]
    assert auto_tokenize_actors(8.0, 0.0) == AUTO_TOKENIZE_MAX
