"""Preflight: a run that cannot work where it is started stops first, in one line that names the field
and the fix, instead of failing after minutes of Ray start-up (or hanging on resources that never come).

    check_environment(cfg)   before Ray starts: what this Python environment must hold
        model.attn_implementation=flash_attention_2 → GPUs and the flash-attn package (``d3ray[flash]``)
        optional extras: train.report_to wandb/mlflow → ``d3ray[wandb]`` / ``d3ray[mlflow]``;
            schedule.regressor=lightgbm (RegMix) → ``d3ray[regmix]``
        storage_path scheme → a pyarrow filesystem (Ray Train writes checkpoints through pyarrow.fs);
            train.checkpoint_upload=direct → a filesystem path, not a URI
        data / eval / SFT paths' schemes → an fsspec filesystem (s3:// needs s3fs, gs:// gcsfs, ...)
    check_cluster(cfg, ...)  right after ``ray.init``: the GPUs the run holds at once against the cluster's
        (trainers + the scheduler's actors in total; trainers on distinct GPUs; a trainer's GPUs on one node)

Rules on the config's fields alone (the global batch splits over workers and micro-batches; a fractional
``train.gpus_per_worker`` of at most 0.5 with several workers, which would put two ranks on one GPU) are
checked when the config is built (``TrainConfig.__post_init__``): such a config never exists.

On a cluster that can grow (joined with ``ray.address``, where an autoscaler may add GPU nodes) a
shortfall is a warning; on the local instance ``d3ray`` started itself it is an error.
"""

from __future__ import annotations

import importlib.util
import logging
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from d3ray.errors import UserError

logger = logging.getLogger(__name__)

#: pyarrow.fs filesystems by URI scheme (``pyarrow.fs.FileSystem.from_uri``, what Ray Train's storage
#: resolves ``storage_path`` with) and the compiled module each needs (absent from some pyarrow builds).
PYARROW_SCHEMES = {
    "s3": "pyarrow._s3fs",
    "gs": "pyarrow._gcsfs",
    "gcs": "pyarrow._gcsfs",
    "hdfs": "pyarrow._hdfs",
    "viewfs": "pyarrow._hdfs",
    "abfs": "pyarrow._azurefs",
    "abfss": "pyarrow._azurefs",
}


def module_importable(name: str) -> bool:
    """Whether ``import name`` would find the module (without importing it)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a missing parent package
        return False


def uri_scheme(path: str) -> str:
    """The scheme of a URI (``s3://b/k`` → ``s3``); ``""`` for a local path (``file://`` counts as local)."""
    if "://" not in path:
        return ""
    scheme = path.split("://", 1)[0].lower()
    return "" if scheme in ("file", "local") else scheme


def storage_problem(storage_path: str | None, importable: Callable[[str], bool] = module_importable) -> str | None:
    """Why Ray Train could not write checkpoints to ``storage_path``, or None."""
    scheme = uri_scheme(storage_path or "")
    if not scheme:
        return None
    module = PYARROW_SCHEMES.get(scheme)
    if module is None:
        return (f"storage_path={storage_path!r}: Ray Train writes checkpoints through pyarrow.fs, which has no "
                f"{scheme}:// filesystem; use s3://, gs://, abfs://, hdfs:// or a path every node shares")
    if not importable(module):
        return (f"storage_path={storage_path!r}: this pyarrow build has no {scheme}:// filesystem ({module}); "
                f"install a pyarrow wheel from PyPI (they include S3, GCS and Azure) or use a shared path")
    return None


def fsspec_problem(field: str, path: str) -> str | None:
    """Why fsspec could not open ``path`` (configured as ``field``), or None."""
    import fsspec

    scheme = uri_scheme(path)
    if not scheme:
        return None
    try:
        fsspec.get_filesystem_class(scheme)
    except ImportError as err:  # fsspec knows the scheme; its package is missing ("Install s3fs to access S3")
        return f"{field}={path!r}: no {scheme}:// filesystem installed: {err} (on every node that reads data)"
    except ValueError:
        return f"{field}={path!r}: fsspec knows no {scheme}:// filesystem; use a local path or s3:// / gs://"
    return None


def configured_paths(cfg: Any) -> Iterable[tuple[str, str]]:
    """``(field, path)`` of every data path the run reads."""
    for field_name, paths in (("data.train_paths", cfg.data.train_paths),
                              ("data.validation_paths", cfg.data.validation_paths),
                              ("eval.ood_text_paths", cfg.eval.ood_text_paths),
                              ("eval.sft_paths", cfg.eval.sft_paths),
                              ("sft.paths", cfg.sft.paths if cfg.sft is not None else [])):
        for path in paths:
            yield field_name, path


def environment_problems(cfg: Any, importable: Callable[[str], bool] = module_importable) -> list[str]:
    """What this Python environment lacks for ``cfg`` (a :class:`~d3ray.config.RunConfig`), one line each."""
    problems = []
    if cfg.model.attn_implementation == "flash_attention_2":
        if not cfg.train.use_gpu:
            problems.append("model.attn_implementation=flash_attention_2 runs on GPUs only: set "
                            "train.gpus_per_worker>0, or model.attn_implementation=sdpa (or eager) on the CPU")
        elif not importable("flash_attn"):
            problems.append("model.attn_implementation=flash_attention_2 needs the flash-attn package: "
                            "pip install 'd3ray[flash]' on every GPU node, or use model.attn_implementation=sdpa")
    from d3ray.train.tracking import tracker_problem

    problems += [p for p in (tracker_problem(name, importable) for name in cfg.train.report_to) if p]
    if getattr(cfg.schedule, "regressor", None) == "lightgbm" and not importable("lightgbm"):
        problems.append("schedule.regressor=lightgbm (RegMix) needs the lightgbm package: pip install "
                        "'d3ray[regmix]', or use schedule.regressor=ridge")
    storage = storage_problem(cfg.storage_path, importable)
    if storage:
        problems.append(storage)
    if cfg.train.checkpoint_upload == "direct" and uri_scheme(cfg.storage_path or ""):
        problems.append(f"train.checkpoint_upload=direct saves into storage_path's directories, which "
                        f"storage_path={cfg.storage_path!r} is not: use train.checkpoint_upload=auto or async")
    for field_name, path in configured_paths(cfg):
        problem = fsspec_problem(field_name, path)
        if problem and problem not in problems:
            problems.append(problem)
    return problems


def gpu_demand(cfg: Any) -> tuple[float, float, float]:
    """``(total, distinct, per_trainer)`` GPUs of a run: all it holds at once (trainers + the scheduler's
    actors), the whole GPUs its processes occupy as Ray places them (each rank on a GPU of its own: Ray
    packs fractions of at most 0.5 onto one GPU, refused by TrainConfig; a share above 0.5 leaves the rest
    of its GPU to smaller shares only), and one trainer's share (it must fit on one node)."""
    from d3ray.run.cluster import gpu_shares, gpus_held
    from d3ray.schedule.config import resources_total

    t = cfg.train
    trainers = t.num_workers * t.gpus_per_worker
    actors = resources_total(cfg.schedule.actor_requests()).get("GPU", 0.0)
    distinct = t.num_workers * math.ceil(t.gpus_per_worker) if t.num_workers > 1 else trainers
    # Fractions as Ray places them: 2 ranks of 0.6 and an actor of 0.6 hold 3 GPUs, not 1.8 (gpus_held).
    distinct = max(distinct, float(gpus_held(gpu_shares(cfg))))
    return trainers + actors, distinct, t.gpus_per_worker


def cluster_problems(cfg: Any, node_gpus: Sequence[float]) -> list[str]:
    """Why a cluster whose alive nodes have ``node_gpus`` GPUs each cannot hold the run, one line each."""
    total, distinct, per_trainer = gpu_demand(cfg)
    have = float(sum(node_gpus))
    t = cfg.train
    asked = (f"train.num_workers={t.num_workers} x train.gpus_per_worker={t.gpus_per_worker:g}"
             + (f" + {total - t.num_workers * t.gpus_per_worker:g} for the scheduler's actors (schedule.*_num_gpus)"
                if total > t.num_workers * t.gpus_per_worker else ""))
    problems = []
    if total > have + 1e-9 or distinct > have + 1e-9:
        fix = ("set train.gpus_per_worker=0 to train on the CPU" if have == 0 else
               "lower train.num_workers or the GPU shares, or add GPU nodes")
        need = max(total, distinct)
        problems.append(f"the run asks {need:g} GPU{'' if need == 1 else 's'} ({asked}) but the cluster has "
                        f"{have:g}: {fix}")
    elif per_trainer > max(node_gpus, default=0.0) + 1e-9:
        problems.append(f"train.gpus_per_worker={per_trainer:g} exceeds the GPUs of any one node "
                        f"({max(node_gpus, default=0.0):g}): a rank's GPUs must share a node; lower it")
    return problems


def check_environment(cfg: Any) -> None:
    """Raise a one-line :class:`UserError` if this environment cannot run ``cfg`` (before Ray starts)."""
    problems = environment_problems(cfg)
    if problems:
        raise UserError("; ".join(problems))


def check_cluster(cfg: Any, fixed: bool) -> None:
    """Check ``cfg``'s GPUs against the connected Ray cluster's alive nodes (after ``ray.init``).

    Args:
        cfg: the run's :class:`~d3ray.config.RunConfig`.
        fixed: the cluster cannot grow (a local instance d3ray started): a shortfall raises. Otherwise an
            autoscaler may still add the GPU nodes, and a shortfall is logged as a warning.

    Raises:
        UserError: one line naming the fields and the fix, when ``fixed`` and the run cannot fit.
    """
    import ray

    node_gpus = [float(node["Resources"].get("GPU", 0.0)) for node in ray.nodes() if node.get("Alive")]
    problems = cluster_problems(cfg, node_gpus)
    if problems and fixed:
        raise UserError("; ".join(problems))
    for problem in problems:
        logger.warning("%s (waiting for the autoscaler to add GPU nodes)", problem)
