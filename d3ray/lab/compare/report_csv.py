"""The comparison report's two CSV files: results.csv (one row per metric and arm) and runs.csv (one per run).

    results.csv  n, mean, std, eval SE, paired Δ vs the baseline, relative change, t and bootstrap
                 intervals, p (and Holm's), wins, verdict; vs the best baseline for methods; the seeds
                 a paired t-test needs for the observed Δ and for the paper's effect
    runs.csv     status, error, seconds, every final metric and the compute parts
"""

from __future__ import annotations

import csv
import io
import math
from typing import Any

from d3ray.lab.compare.readout import PAPER_EFFECT_NATS, seeds_for_power
from d3ray.lab.compare.table import RUN_FIGURES, ArmResult, RunRecord
from d3ray.run_files import display_path

CSV_FIELDS = ["metric", "arm", "kind", "best_baseline", "n", "mean", "std", "eval_se", "diff_vs_baseline",
              "rel_change_pct", "ci_low", "ci_high", "boot_low", "boot_high", "p_value", "p_holm", "wins", "verdict",
              "diff_vs_best_baseline", "p_vs_best_baseline", "verdict_vs_best_baseline", "control", "diff_vs_control",
              "ci_low_vs_control", "ci_high_vs_control", "p_vs_control", "p_holm_vs_control", "verdict_vs_control",
              "std_diff", "seeds_for_power_observed", "seeds_for_power_paper"]


def results_csv(results: dict[str, list[ArmResult]], power: float = 0.8, confidence: float = 0.95) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_FIELDS)
    writer.writeheader()
    for metric, rows in results.items():
        for r in rows:
            c, b, k = r.vs_baseline, r.vs_best_baseline, r.vs_control
            writer.writerow(_clean({
                "metric": metric, "arm": r.arm, "kind": "method" if r.method else "baseline",
                "best_baseline": r.arm == r.best_baseline, "n": r.summary.n, "mean": r.summary.mean,
                "std": r.summary.std, "eval_se": r.eval_se,
                "diff_vs_baseline": c and c.mean_diff, "rel_change_pct": c and 100 * c.rel_change,
                "ci_low": c and c.ci_low, "ci_high": c and c.ci_high, "boot_low": c and c.boot_low,
                "boot_high": c and c.boot_high, "p_value": c and c.p_value, "p_holm": c and c.p_holm,
                "wins": c and c.wins,
                "verdict": c.verdict if c else "baseline",
                "diff_vs_best_baseline": b and b.mean_diff, "p_vs_best_baseline": b and b.p_value,
                "verdict_vs_best_baseline": b.verdict if b else "", "control": r.control or "",
                "diff_vs_control": k and k.mean_diff, "ci_low_vs_control": k and k.ci_low,
                "ci_high_vs_control": k and k.ci_high, "p_vs_control": k and k.p_value,
                "p_holm_vs_control": k and k.p_holm, "verdict_vs_control": k.verdict if k else "",
                "std_diff": c and c.std_diff,
                "seeds_for_power_observed": c and seeds_for_power(c.mean_diff, c.std_diff, power, 1 - confidence),
                "seeds_for_power_paper": c and metric.split("@")[0].endswith("loss") and seeds_for_power(
                    PAPER_EFFECT_NATS, c.std_diff, power, 1 - confidence) or None}))
    return out.getvalue()


def runs_csv(records: list[RunRecord]) -> str:
    keys = sorted({k for r in records for k in r.metrics if k.startswith(("eval/", "compute/")) or k in RUN_FIGURES})
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["arm", "seed", "status", "seconds", "run_dir", "error", *keys])
    for r in records:
        writer.writerow([r.arm, r.seed, r.status, _clean_value(r.seconds), display_path(r.run_dir), r.error or "",
                         *(_clean_value(r.metrics.get(k)) for k in keys)])
    return out.getvalue()


def _clean(row: dict[str, Any]) -> dict[str, Any]:
    return {k: _clean_value(v) for k, v in row.items()}


def _clean_value(v: Any) -> Any:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return ""
    return round(v, 6) if isinstance(v, float) else v
