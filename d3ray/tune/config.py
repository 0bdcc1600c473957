"""Typed config of a sweep: which runs, which search space, how trials are scheduled and stopped.

One file per sweep in ``tune_configs/`` (values only), loaded with
:func:`~d3ray.config_loading.load_config` like every other config, so dotted command-line
overrides work (``d3ray sweep --config tune_configs/k_L_gamma.yaml --max_concurrent_trials=2``).
The search space itself (``space:``) is a mapping of dotted RunConfig keys to a tiny vocabulary,
parsed and checked by :mod:`d3ray.tune.search_space`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from d3ray.config import RayClusterConfig
from d3ray.registry import ChoiceConfig


class TrialSchedulerConfig(ChoiceConfig):
    """When Tune stops a trial early (``type: asha | fifo``)."""

    def build(self, max_t: int) -> Any:
        """The ``ray.tune`` TrialScheduler (metric and mode come from the TuneConfig);
        ``max_t`` is the longest trial, in training steps."""
        raise NotImplementedError


@TrialSchedulerConfig.register("fifo")
@dataclass(frozen=True, kw_only=True)
class FifoConfig(TrialSchedulerConfig):
    """Every trial runs to the end (no early stopping)."""

    def build(self, max_t: int) -> Any:
        from ray.tune.schedulers import FIFOScheduler

        return FIFOScheduler()


@TrialSchedulerConfig.register("asha")
@dataclass(frozen=True, kw_only=True)
class AshaConfig(TrialSchedulerConfig):
    """Asynchronous successive halving (Li et al. 2020) on the sweep metric, in training steps.

    A trial reaches a rung at ``grace_period · reduction_factor^i`` steps; it continues only if its
    metric is in the best ``1 / reduction_factor`` of the trials recorded at that rung. The metric
    (validation loss) exists only where the trainers evaluated, so rungs should sit on eval steps:
    make ``grace_period`` a multiple of ``train.eval_every``, and ``eval_every`` a multiple of
    ``schedule.L`` (the trainers report to Tune at chunk ends).
    """

    grace_period: int = 60
    """Steps every trial runs before it may be stopped."""
    reduction_factor: float = 2.0
    """Keep the best 1/reduction_factor at each rung."""
    max_t: int | None = None
    """Last rung, in steps; default: the largest ``train.steps`` of the sweep's trials."""

    def __post_init__(self) -> None:
        if self.grace_period < 1:
            raise ValueError(f"scheduler.grace_period={self.grace_period} must be >= 1")
        if not self.reduction_factor > 1:
            raise ValueError(f"scheduler.reduction_factor={self.reduction_factor} must be > 1")
        if self.max_t is not None and self.max_t < self.grace_period:
            raise ValueError(f"scheduler.max_t={self.max_t} must be >= grace_period={self.grace_period}")

    def build(self, max_t: int) -> Any:
        from ray.tune.schedulers import ASHAScheduler

        return ASHAScheduler(
            time_attr=STEP_ATTR,
            max_t=self.max_t or max(max_t, self.grace_period),
            grace_period=self.grace_period,
            reduction_factor=self.reduction_factor,
        )


#: The training-step key of every report the trainers send (ASHA's time attribute).
STEP_ATTR = "step"


@dataclass(frozen=True, kw_only=True)
class SweepConfig:
    """A Ray Tune sweep over whole training runs (one trial = one ``run_pretrain``)."""

    name: str
    """Sweep name; the sweep directory is ``<storage_path>/<name>``. Re-running it resumes it."""
    base_config: str | None = None
    """RunConfig YAML every trial starts from (e.g. ``jobs/configs/tiny.yaml``); None: the defaults."""
    space: dict[str, Any] = field(default_factory=dict)
    """Dotted RunConfig key → ``{grid: [...]}``, ``{choice: [...]}``, ``{uniform: [lo, hi]}``,
    ``{loguniform: [lo, hi]}``, ``{randint: [lo, hi]}`` (hi excluded) or a constant."""
    metric: str = "eval/mean_loss"
    """Metric the trainers report that ranks trials and drives early stopping (validation loss)."""
    mode: str = "min"
    """``min`` or ``max`` of ``metric``."""
    num_samples: int = 1
    """Samples of the random axes per grid point (grid axes are crossed, random axes drawn)."""
    search_seed: int = 0
    """Seed of the random axes' draws (the same seed gives the same trials)."""
    scheduler: TrialSchedulerConfig = field(default_factory=AshaConfig)
    """Early stopping: ``type: asha`` (default) or ``fifo`` (none)."""
    max_concurrent_trials: int | None = None
    """Trials at once; None: derived from the cluster's CPUs/GPUs and each trial's needs."""
    storage_path: str = "runs/sweeps"
    """Parent of the sweep directory: a local or shared path, or ``s3://`` / ``gs://`` (Tune state,
    results table, best config). Relative paths are taken from the working directory."""
    runs_dir: str | None = None
    """Parent of the trials' run directories (RunConfig.output_dir); default ``<sweep dir>/runs``.
    Required when ``storage_path`` is a URI (run directories are file-system paths)."""
    trial_max_failures: int = 0
    """Times Tune restarts a failed trial (it resumes from the trial run's newest checkpoint).
    Worker failures inside a trial are Ray Train's (``train.max_failures``)."""
    driver_cpus: float = 0.01
    """CPUs reserved for each trial's driver (the Tune function that fits the TorchTrainer; the
    trainers, data and D3 actors reserve their own resources)."""
    ray: RayClusterConfig = field(default_factory=RayClusterConfig)
    """How the sweep driver connects to Ray (``address: auto`` inside ``ray job submit``)."""

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name:
            raise ValueError(f"name={self.name!r} must be a non-empty name without '/'")
        if self.mode not in ("min", "max"):
            raise ValueError(f"mode={self.mode!r} must be 'min' or 'max'")
        if self.num_samples < 1:
            raise ValueError(f"num_samples={self.num_samples} must be >= 1")
        if self.max_concurrent_trials is not None and self.max_concurrent_trials < 1:
            raise ValueError(f"max_concurrent_trials={self.max_concurrent_trials} must be >= 1 or null")
        if self.trial_max_failures < -1:
            raise ValueError(f"trial_max_failures={self.trial_max_failures} must be >= -1")
        if not self.driver_cpus > 0:
            raise ValueError(
                f"driver_cpus={self.driver_cpus} must be > 0 (Tune rejects empty trial resources)"
            )
        if is_uri(self.storage_path) and self.runs_dir is None:
            raise ValueError(
                f"runs_dir must be set when storage_path={self.storage_path!r} is a URI: trial run "
                "directories are file-system paths (a shared one, e.g. NFS, on a multi-node cluster)"
            )


def is_uri(path: str) -> bool:
    """True for ``scheme://...`` (s3, gs, ...) other than ``file://``."""
    return "://" in path and not path.startswith("file://")
