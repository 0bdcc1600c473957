"""Connecting to Ray: start or join a cluster, and the environment every worker and actor gets.

Used by every entry point that starts Ray (``d3ray pretrain``, ``d3ray sweep``, the benchmarks).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path

from d3ray.config import RayClusterConfig, RunConfig
from d3ray.data.config import DataConfig, auto_tokenize_actors

logger = logging.getLogger(__name__)

RAY_DATA_LOGGING = Path(__file__).resolve().parents[1] / "ray_data_logging.yaml"  # package data of d3ray/


#: Driver environment variables that every Ray worker and actor gets as well, by prefix: Hugging Face
#: caches and offline switches (``HF_HOME``, ``HF_DATASETS_OFFLINE``, ``TRANSFORMERS_OFFLINE``), the
#: trackers' settings (``WANDB_*``, ``MLFLOW_*``), NCCL tuning and cloud credentials (``AWS_*``).
PASSTHROUGH_PREFIXES = ("HF_", "TRANSFORMERS_", "WANDB_", "MLFLOW_", "NCCL_", "AWS_")


def passthrough_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``environ`` (the driver's environment) that Ray workers inherit (``PASSTHROUGH_PREFIXES``)."""
    return {k: v for k, v in sorted(environ.items()) if k.startswith(PASSTHROUGH_PREFIXES)}


def worker_env(cfg: RunConfig, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for Ray Train workers and actors (DeepSpeed on CPU, quiet Ray Data and Train): the
    driver's pass-through variables (``environ``, default ``os.environ``: :func:`passthrough_env`), d3ray's
    own settings, then ``ray.env_vars`` (the config's, which win)."""
    env = {
        **passthrough_env(os.environ if environ is None else environ),
        "RAY_DATA_DISABLE_PROGRESS_BARS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": str(cfg.ray.health_check_interval_s),
        "RAY_TRAIN_ENABLE_PRINT_PATCH": "0",  # progress lines are printed once, not print + log
        "RAY_DATA_LOGGING_CONFIG": str(RAY_DATA_LOGGING),  # Ray Data's INFO lines to its log file only
    }
    if not cfg.train.use_gpu:
        env["DS_ACCELERATOR"] = "cpu"
    if cfg.ray.address in (None, "local"):
        # Ray Train's preemption watcher looks for nodes being drained, which a local one-node instance
        # never is; it is created with the workers' handles, so its process logs an E-level line
        # ("constructor arguments in the object store") that a newcomer reads as a failure.
        env["RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"] = "0"
    env.update(cfg.ray.env_vars)
    return env


def job_env_vars(env: dict[str, str], environ: Mapping[str, str]) -> dict[str, str]:
    """``env`` less the variables a submitted job's own runtime env sets (``ray job submit --runtime-env``):
    Ray refuses a driver ``runtime_env`` that names one of them again, and the job's value is already in
    this driver's ``environ`` and reaches every worker through the job's runtime env."""
    job = json.loads(environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR") or "{}")
    taken = ((job.get("runtime_env") or {}).get("env_vars") or {}).keys()
    return {k: v for k, v in env.items() if k not in taken}


def start_ray(ray_cfg: RayClusterConfig, env: dict[str, str]) -> bool:
    """Connect to or start Ray; returns True if this call started it (so the caller shuts it down)."""
    import ray

    os.environ.update(env)  # a local instance's raylet (and so every actor) inherits these
    if ray.is_initialized():
        return False
    quiet_ray_notices()
    if ray_cfg.address not in (None, "local"):
        # a joined cluster's workers do not inherit this process's environment: the job's runtime_env
        ray.init(address=ray_cfg.address, runtime_env={"env_vars": job_env_vars(env, os.environ)})
        return True
    init_local_ray(ray_cfg.num_cpus or max(4, os.cpu_count() or 1), log_to_driver=True)
    return True


def start_autoscaling_coordinator():
    """Start Ray's autoscaling coordinator (the detached actor Ray Train's controller asks for the workers'
    resources, with a 5 s timeout) now, while the run prepares; returns a ref that is ready when it is up,
    or None where this Ray has no such actor.

    On a loaded machine the actor's cold start outlasts the controller's first 5 s request, and Ray Train
    logs a WARNING with a full traceback ("Failed to send resource request ... safe to ignore") to the
    run's console. Started ahead (the same name, namespace and node as Ray's own ``get_or_create``), the
    controller finds it running; :func:`wait_for_autoscaling_coordinator` waits for it before the fit.
    """
    try:
        from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
            get_or_create_autoscaling_coordinator,
        )
    except ImportError:  # a Ray without it: nothing to warm
        return None
    return get_or_create_autoscaling_coordinator().__ray_ready__.remote()


def wait_for_autoscaling_coordinator(ref, timeout_s: float = 120.0) -> None:
    """Wait (at most ``timeout_s``) for ``ref`` from :func:`start_autoscaling_coordinator`; a slow start only
    costs Ray Train's warning, so the wait gives up quietly (logged at INFO)."""
    import ray

    if ref is not None and not ray.wait([ref], timeout=timeout_s)[0]:
        logger.info("Ray's autoscaling coordinator is not up after %.0f s; Ray Train may warn once", timeout_s)


def quiet_ray_notices() -> None:
    """Ray's notices that are no fault of the run stay off d3ray's console: ``ray.init`` says on every start
    (or connection) that token authentication is on (Ray's default for a new local instance) or off."""
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)


def init_local_ray(num_cpus: int, log_to_driver: bool) -> None:
    """Start a local Ray instance whose processes all know its dashboard address.

    Ray's State API (used by Ray Train's placement-group cleaner) otherwise looks the cluster up by
    scanning for running GCS processes, and fails with "Found multiple active Ray instances" when
    another Ray instance runs on the machine. Choosing the dashboard port here and exporting
    ``RAY_API_SERVER_ADDRESS`` before ``ray.init`` (so that the raylet and every worker inherit it)
    pins every lookup to this instance. ``address="local"`` always starts a new instance: without
    it ``ray.init`` joins whatever cluster ``RAY_ADDRESS`` or ``/tmp/ray/ray_current_cluster`` names
    (for example one a ``ray start --head`` left behind).
    """
    import socket

    import ray

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ["RAY_API_SERVER_ADDRESS"] = f"http://127.0.0.1:{port}"
    quiet_ray_notices()
    ray.init(address="local", num_cpus=num_cpus, log_to_driver=log_to_driver,
             logging_level=logging.WARNING, include_dashboard=True, dashboard_host="127.0.0.1", dashboard_port=port)
    logger.info("started a local Ray instance (%d CPUs, dashboard port %d, token authentication %s)", num_cpus,
                port, os.environ.get("RAY_AUTH_MODE", "?"))


def size_tokenizers(cfg: RunConfig, data: DataConfig, cluster_cpus: float) -> DataConfig:
    """``data`` with ``tokenize_actors=0`` resolved for a cluster of ``cluster_cpus`` CPUs (logged): what the
    trainers (``train.num_workers · cpus_per_worker``) and the scheduler's actors reserve is theirs; the
    tokenizers take the rest (:func:`~d3ray.data.config.auto_tokenize_actors`). A set value is kept."""
    if data.tokenize_actors != 0:
        return data
    from d3ray.schedule.config import resources_total

    reserved = cfg.train.num_workers * cfg.train.cpus_per_worker
    reserved += resources_total(cfg.schedule.actor_requests()).get("CPU", 0.0)
    actors = auto_tokenize_actors(cluster_cpus - reserved, data.tokenize_cpus)
    logger.info("data.tokenize_actors=0: %d tokenizers (%.2f of %.2f CPUs left after the trainers and the "
                "scheduler's actors, %.2f each)", actors, cluster_cpus - reserved, cluster_cpus, data.tokenize_cpus)
    return dataclasses.replace(data, tokenize_actors=actors)


def gpu_shares(cfg: RunConfig) -> list[float]:
    """The GPU requests of one run (or sweep trial), one per process that holds GPUs: each trainer rank's
    ``train.gpus_per_worker`` and each scheduler actor's share (``schedule.actor_requests()``)."""
    shares = [cfg.train.gpus_per_worker] * cfg.train.num_workers if cfg.train.use_gpu else []
    for request in cfg.schedule.actor_requests():
        shares += [request.resources.get("GPU", 0.0)] * request.count
    return [s for s in shares if s > 0]


def gpus_held(shares: list[float]) -> int:
    """The GPUs that processes with GPU ``shares`` occupy as Ray places them: a share of at most 1 comes
    from one GPU (two ranks of 0.6 cannot share one, leaving 0.4 of each idle), a share above 1 is whole
    GPUs. Fractions packed first-fit, largest first."""
    whole = sum(math.ceil(s - 1e-9) for s in shares if s > 1)
    free: list[float] = []  # what is left of each GPU that holds fractions
    for share in sorted((s for s in shares if s <= 1), reverse=True):
        for i, left in enumerate(free):
            if share <= left + 1e-9:
                free[i] = left - share
                break
        else:
            free.append(1.0 - share)
    return whole + len(free)
