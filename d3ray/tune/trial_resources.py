"""What one sweep trial holds of the cluster, and how many trials fit at once.

Under the Train V2 + Tune pattern (docs/design/ray.md §3) Tune schedules only the trial drivers; each
driver's Train run reserves its own workers outside the trial, so Tune cannot see their resources.
``max_concurrent_trials`` is therefore derived here from the cluster's resources and each trial's needs
(:func:`trial_resources`), GPUs by the placement of each trial's shares. The sweep and ``d3ray compare``
(its ``max_concurrent_runs: 0``) both size themselves with :func:`concurrent_trials`.
"""

from __future__ import annotations

import logging
import math

from d3ray.config import RunConfig
from d3ray.data.pipeline import stream_cpus
from d3ray.run.cluster import gpu_shares, gpus_held
from d3ray.schedule.config import resources_total

logger = logging.getLogger(__name__)


def trial_resources(cfg: RunConfig, driver_cpus: float) -> dict[str, float]:
    """Resources one trial holds at once: driver, trainers, Ray Data, and the scheduler's actors.

    CPU = driver + workers·cpus_per_worker + the stream's read and tokenize work (``data.pipeline.stream_cpus``,
    the reservation Ray Data makes) + the scheduler's actors (``schedule.actor_requests()``: D3's influence
    and solver actors, scoring actors, ...);
    GPU = workers·gpus_per_worker + the scheduler's actors'; custom resources likewise.
    """
    t, d = cfg.train, cfg.data
    need: dict[str, float] = {
        "CPU": driver_cpus
        + t.num_workers * t.cpus_per_worker
        + stream_cpus(d),
        "GPU": t.num_workers * t.gpus_per_worker,
    }
    for name, amount in resources_total(cfg.schedule.actor_requests()).items():
        need[name] = need.get(name, 0.0) + amount
    return {k: v for k, v in need.items() if v > 0}


def derive_max_concurrent_trials(cluster: dict[str, float], per_trial: dict[str, float]) -> int:
    """Trials that fit the cluster at once: min over resources of ⌊total / per trial⌋, at least 1.

    On an autoscaling cluster the current resources understate what it can grow to: set
    ``max_concurrent_trials`` in the sweep config there.
    """
    fits = []
    for name, amount in per_trial.items():
        have = float(cluster.get(name, 0.0))
        fits.append(math.floor(have / amount + 1e-9))
        if have < amount:
            logger.warning(
                "a trial needs %s=%g but the cluster has %g now (autoscaling?)", name, amount, have
            )
    return max(1, min(fits)) if fits else 1


def trials_on_gpus(shares: list[float], gpus: float, at_most: int) -> int:
    """How many trials (at most ``at_most``) with GPU ``shares`` each fit on ``gpus`` GPUs at once
    (:func:`gpus_held` of their shares together); 0 when not even one does."""
    trials = at_most
    while trials > 0 and gpus_held(shares * trials) > gpus + 1e-9:
        trials -= 1
    return trials


def concurrent_trials(cluster: dict[str, float], configs: list[RunConfig], driver_cpus: float) -> tuple[int, dict]:
    """Trials of ``configs`` that fit ``cluster`` at once, and the most any one needs of each resource:
    :func:`derive_max_concurrent_trials` over :func:`trial_resources`, and for GPUs the placement of
    each trial's shares (:func:`trials_on_gpus`: ⌊GPUs / per trial⌋ counts 3 trials of 2 ranks × 0.6
    on 4 GPUs, where only 2 fit), at least 1."""
    per_trial: dict[str, float] = {}
    for cfg in configs:  # the most any trial needs, resource by resource
        for name, amount in trial_resources(cfg, driver_cpus).items():
            per_trial[name] = max(per_trial.get(name, 0.0), amount)
    fits = derive_max_concurrent_trials(cluster, per_trial)  # ⌊total / per trial⌋: an upper bound for GPUs
    for shares in (gpu_shares(cfg) for cfg in configs):
        if shares:
            fits = min(fits, trials_on_gpus(shares, float(cluster.get("GPU", 0.0)), fits))
    return max(1, fits), per_trial
