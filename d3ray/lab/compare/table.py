"""The comparison's table: per run its metrics, eval standard errors and compute; per metric the
arms' summaries and paired comparisons against the baseline arm.

    outcomes ──► RunRecord per run (final metrics + compute + <metric>@equal_compute)
             ──► values[metric][arm][seed] ──► ArmResult per (metric, arm): Summary, eval SE,
                                                PairedComparison vs the baseline (and vs the best baseline)

Equal compute (``<metric>@equal_compute``): for each seed, the budget is the baseline arm's total
compute in that seed; each arm's metric is read off its own eval curve where its cumulative compute
reaches the budget (``compute.value_at_compute``). The baseline's own value is its final one.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from d3ray.lab.compare.compute import (
    ComputeBreakdown,
    compute_curve,
    eval_curve,
    run_compute,
    value_at_compute,
)
from d3ray.lab.compare.grid import RunOutcome
from d3ray.lab.compare.plan import ComparePlan
from d3ray.lab.compare.readout import curve_auc, last_k_mean, readout_key
from d3ray.lab.compare.stats import (
    PairedComparison,
    Summary,
    holm_verdicts,
    lower_is_better,
    paired_comparison,
    summarize,
)
from d3ray.lab.schedule_questions import influence_actor_count

EQUAL_COMPUTE = "@equal_compute"
#: Final-metric keys carried into the table besides ``eval/*`` (run figures, not compared by default).
RUN_FIGURES = ("final_loss", "tokens", "tokens_per_sec", "train_seconds", "wall_seconds",
               "schedule/fallbacks", "schedule/trainer_wait_sec",
               "schedule/predicted_loss_change_vs_stream_nats", "schedule/predicted_loss_change_vs_random_nats",
               "schedule/skipped_samples")


@dataclass
class RunRecord:
    """One run's numbers (empty when it failed)."""

    arm: str
    seed: int
    status: str
    error: str | None
    run_dir: Path
    metrics: dict[str, float] = field(default_factory=dict)
    se: dict[str, float] = field(default_factory=dict)
    """metric → the eval's own standard error of it in this run."""
    compute: ComputeBreakdown | None = None
    equal_compute_within_budget: bool = False
    seconds: float | None = None


@dataclass(frozen=True)
class ArmResult:
    """One arm on one metric."""

    metric: str
    arm: str
    method: bool
    summary: Summary
    eval_se: float
    """Mean over seeds of the eval's own standard error (NaN where it is not known)."""
    vs_baseline: PairedComparison | None
    """None for the baseline arm itself."""
    vs_best_baseline: PairedComparison | None = None
    best_baseline: str | None = None
    """The leading baseline arm on this metric (the same for every row of the metric)."""
    vs_control: PairedComparison | None = None
    control: str | None = None
    """The arm's own control (``ArmConfig.control``), when it names one."""


def run_records(plan: ComparePlan, outcomes: list[RunOutcome]) -> list[RunRecord]:
    """Every run's record, with compute and the primary metric at the baseline's compute."""
    records = []
    for outcome in outcomes:
        spec = outcome.spec
        record = RunRecord(spec.arm, spec.seed, outcome.status, outcome.error, spec.run_dir, seconds=outcome.seconds)
        if outcome.ok and spec.config is not None:
            final = outcome.final
            record.metrics = {k: float(v) for k, v in final.items()
                              if (k.startswith("eval/") or k in RUN_FIGURES) and _number(v) and not k.endswith("_se")}
            record.se = {k[:-3]: float(v) for k, v in final.items() if k.endswith("_se") and _number(v)}
            record.se.update(exact_match_se(spec.run_dir, record.metrics))
            record.compute = run_compute(spec.run_dir, spec.config.train.num_workers, influence_actor_count(spec.config.schedule))
            record.metrics.update(record.compute.as_metrics())
            record.metrics.update(readouts(spec.run_dir, plan.compare.metric, plan.compare.report.k, plan.trunk_steps))
        records.append(record)
    _add_equal_compute(plan, records)
    return records


def readouts(run_dir: Path, metric: str, k: int, after_step: int) -> dict[str, float]:
    """``<metric>@last<k>`` and ``<metric>@auc`` of the run's eval curve after ``after_step`` (the trunk's
    end; ``readout.py``), where it has evaluations there."""
    steps, values = eval_curve(run_dir, metric)
    out = {readout_key(metric, "last_k_mean", k): last_k_mean(steps, values, k, after_step),
           readout_key(metric, "auc", 0): curve_auc(steps, values, after_step)}
    return {key: v for key, v in out.items() if math.isfinite(v)}


def _add_equal_compute(plan: ComparePlan, records: list[RunRecord]) -> None:
    metric = plan.compare.metric
    budget = {r.seed: r.compute.total_sec for r in records
              if r.arm == plan.compare.baseline and r.compute is not None}
    configs = {s.name: s.config for s in plan.runs}
    for r in records:
        if r.compute is None or r.seed not in budget:
            continue
        cfg = configs[r.run_dir.name]
        assert cfg is not None
        steps, values = eval_curve(r.run_dir, metric)
        c_steps, spent = compute_curve(r.run_dir, cfg.train.num_workers, influence_actor_count(cfg.schedule))
        at = value_at_compute(steps, values, c_steps, spent, budget[r.seed])
        if math.isfinite(at.value):
            r.metrics[metric + EQUAL_COMPUTE] = at.value
            r.equal_compute_within_budget = at.within_budget


def exact_match_se(run_dir: Path, metrics: dict[str, float]) -> dict[str, float]:
    """Binomial standard errors √(p(1 − p)/n) of the skill suite's exact-match metrics, with n from the
    suite's ``manifest.json`` in the run directory (``sft_data/``; a run on other SFT files gets none)."""
    manifest = run_dir / "sft_data" / "manifest.json"
    if not manifest.is_file():
        return {}
    counts: dict[str, dict[str, int]] = json.loads(manifest.read_text())["counts"].get("test", {})
    n_of = {"": sum(sum(levels.values()) for levels in counts.values())}
    for skill, levels in counts.items():
        n_of[f":{skill}"] = sum(levels.values())
        n_of.update({f":{skill}:d{d}": n for d, n in levels.items()})
    out = {}
    for key, p in metrics.items():
        if not (key.startswith("eval/sft:") and key.endswith("/exact_match")):
            continue
        task = key[len("eval/"):-len("/exact_match")]  # sft:test[:skill[:dk]]
        parts = task.split(":")
        n = n_of.get("".join(f":{p_}" for p_ in parts[2:]), 0)
        if n > 0:
            out[key] = math.sqrt(max(p * (1 - p), 0.0) / n)
    return out


def metric_values(records: list[RunRecord]) -> dict[str, dict[str, dict[int, float]]]:
    """``values[metric][arm][seed]`` over the finished runs."""
    values: dict[str, dict[str, dict[int, float]]] = {}
    for r in records:
        for key, value in r.metrics.items():
            values.setdefault(key, {}).setdefault(r.arm, {})[r.seed] = value
    return values


def compare_metric(metric: str, values: dict[str, dict[int, float]], se: dict[str, list[float]], arms: list[str],
                   methods: dict[str, bool], baseline: str, confidence: float,
                   controls: dict[str, str] | None = None) -> list[ArmResult]:
    """Every arm on ``metric``: summary, eval SE, paired comparison vs the baseline, vs the best baseline
    and vs its own control.

    Args:
        values: arm → seed → value.
        se: arm → the eval's standard errors of its runs (may be empty).
        arms: in report order; methods: arm → is a method (else a baseline); controls: arm → its control arm.
    """
    controls = controls or {}
    lower = lower_is_better(metric)
    base = values.get(baseline, {})
    summaries = {arm: summarize(values.get(arm, {})) for arm in arms}
    baselines = [a for a in arms if not methods.get(a) and summaries[a].n > 0]
    best = min(baselines, key=lambda a: summaries[a].mean if lower else -summaries[a].mean) if baselines else None
    out = []
    for arm in arms:
        ses = [s for s in se.get(arm, []) if math.isfinite(s)]
        vs = None if arm == baseline else paired_comparison(values.get(arm, {}), base, lower, confidence)
        vs_best = None
        if methods.get(arm) and best is not None and best != baseline:
            vs_best = paired_comparison(values.get(arm, {}), values.get(best, {}), lower, confidence)
        control = controls.get(arm)
        vs_control = (paired_comparison(values.get(arm, {}), values.get(control, {}), lower, confidence)
                      if control is not None else None)
        out.append(ArmResult(metric, arm, bool(methods.get(arm)), summaries[arm],
                             sum(ses) / len(ses) if ses else float("nan"), vs, vs_best, best, vs_control, control))
    # several arms are several tests: Holm over the metric's comparisons (each family on its own)
    vs_all = holm_verdicts([r.vs_baseline for r in out], confidence)
    vs_best_all = holm_verdicts([r.vs_best_baseline for r in out], confidence)
    vs_control_all = holm_verdicts([r.vs_control for r in out], confidence)
    return [replace(r, vs_baseline=v, vs_best_baseline=b, vs_control=c)
            for r, v, b, c in zip(out, vs_all, vs_best_all, vs_control_all, strict=True)]


def arm_ses(records: list[RunRecord], metric: str) -> dict[str, list[float]]:
    """arm → the eval's standard errors of ``metric`` over its runs (the primary's at equal compute:
    the final evaluation's, as the interpolated points come from evaluations of the same size)."""
    key = metric.removesuffix(EQUAL_COMPUTE)
    out: dict[str, list[float]] = {}
    for r in records:
        if key in r.se:
            out.setdefault(r.arm, []).append(r.se[key])
    return out


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
