"""One sweep trial: the Tune function trainable that fits one whole training run, and what it reports.

Tune calls :func:`train_driver` with the trial's parameters and the sweep's :class:`TrialPlan` (passed with
``tune.with_parameters``; no globals). It builds the trial's RunConfig (base + the trial's dotted keys;
name ``<sweep>-<trial_id>``, output_dir ``<sweep dir>/runs``) and fits the TorchTrainer through
``run_pretrain``, whose Ray Train callback (:func:`sweep_report_callback`) forwards every checkpointed
report with a finite metric to Tune (for ASHA); the last step's metrics are reported once the run returns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from d3ray.tune.config import STEP_ATTR
from d3ray.tune.search_space import trial_run_config


@dataclass(frozen=True)
class TrialPlan:
    """What every trial driver needs (passed with ``tune.with_parameters``; no globals)."""

    base: dict[str, Any]
    """The base RunConfig as a plain dict, paths absolute."""
    sweep_name: str
    runs_dir: str
    """Absolute parent of the trials' run directories."""
    metric: str


def _finite_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """Drop non-finite numbers (NaN/inf must never reach Tune's scheduler or Train's scoring)."""
    out = {}
    for key, value in metrics.items():
        if isinstance(value, float) and not math.isfinite(value):
            continue
        out[key] = value
    return out


def sweep_report_callback(metric: str, steps: int) -> Any:
    """A Ray Train callback forwarding rank 0's intermediate reports to Tune (for ASHA).

    The trainers report at checkpoints (every ``train.checkpoint_every_chunks`` chunks) with the
    training ``step`` and the latest validation metrics. Forwarded: reports before the last step
    that carry a finite ``metric`` (Tune requires it in every result; NaN/inf must never reach it).
    The last step's metrics are reported by the driver once ``run_pretrain`` has returned, so an
    ASHA stop on them cannot cut the run's final bookkeeping (final_metrics.json) short.
    """
    from ray.tune.integration.ray_train import TuneReportCallback

    class SweepReportCallback(TuneReportCallback):
        def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
            row = _finite_metrics(metrics[0])
            if metric not in row or row.get(STEP_ATTR, steps) >= steps:
                return
            super().after_report(run_context, [row], checkpoint)

    return SweepReportCallback()


def train_driver(params: dict[str, Any], plan: TrialPlan) -> None:
    """The Tune function trainable: one whole training run with the trial's parameters.

    Raises:
        RuntimeError: the run ended without a finite metric (diverged, or no validation data).
    """
    import ray.tune

    from d3ray.run.pretrain import run_pretrain

    trial_id = ray.tune.get_context().get_trial_id()
    cfg = trial_run_config(plan.base, params, name=f"{plan.sweep_name}-{trial_id}", output_dir=plan.runs_dir)
    final = run_pretrain(cfg, callbacks=[sweep_report_callback(plan.metric, cfg.train.steps)])
    row = _finite_metrics({k: v for k, v in final.items() if isinstance(v, (int, float, str))})
    if plan.metric not in row:
        raise RuntimeError(
            f"trial {trial_id} ended without a finite {plan.metric} (got {final.get(plan.metric)!r}): "
            "the run diverged, or it has no validation data"
        )
    ray.tune.report({**row, STEP_ATTR: final.get("steps", cfg.train.steps)})
