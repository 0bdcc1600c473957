"""The report directory: results.md, results.csv, runs.csv and the PNG plots.

This module decides what the report holds (the primary metric, the metrics compared, the paired
comparisons of each, the cached unigram figures) and writes the directory; the files are rendered by
``report_markdown.py`` (results.md), ``report_csv.py`` (results.csv, runs.csv) and ``plots.py`` (the PNGs).
"""
from __future__ import annotations

import json
import logging
from typing import Any

from d3ray.lab.compare.grid import RunOutcome
from d3ray.lab.compare.plan import ComparePlan
from d3ray.lab.compare.readout import readout_key
from d3ray.lab.compare.report_csv import results_csv, runs_csv
from d3ray.lab.compare.report_markdown import results_markdown
from d3ray.lab.compare.table import (
    EQUAL_COMPUTE,
    RunRecord,
    arm_ses,
    compare_metric,
    metric_values,
    run_records,
)

logger = logging.getLogger(__name__)


def write_report(plan: ComparePlan, outcomes: list[RunOutcome], command: str = "") -> dict[str, Any]:
    """Write the report directory; returns ``{"dir", "results", "records"}``."""
    out = plan.report_dir
    out.mkdir(parents=True, exist_ok=True)
    records = run_records(plan, outcomes)
    values = metric_values(records)
    cfg = plan.compare
    primary = primary_metric(plan)
    metrics = report_metrics(values, primary, cfg.metric)
    controls = {a.name: a.control for a in cfg.arms if a.control is not None}
    results = {m: compare_metric(m, values[m], arm_ses(records, m), plan.arms, plan.methods, cfg.baseline,
                                 cfg.confidence, controls) for m in metrics}
    entropy = unigram_figures(plan, records)
    from d3ray.lab.compare.plots import write_plots

    plots = write_plots(plan, records, values, out)
    (out / "results.csv").write_text(results_csv(results, cfg.report.power, cfg.confidence))
    (out / "runs.csv").write_text(runs_csv(records))
    (out / "results.md").write_text(results_markdown(plan, records, results, entropy, plots, command, primary))
    return {"dir": out, "results": results, "records": records}


def primary_metric(plan: ComparePlan) -> str:
    """The key the verdicts use: ``metric`` under ``report.metric`` (``eval/mean_loss@last3``, ...)."""
    report = plan.compare.report
    return readout_key(plan.compare.metric, report.metric, report.k)


def report_metrics(values: dict[str, dict[str, dict[int, float]]], primary: str, final: str | None = None) -> list[str]:
    """The metrics compared: the primary read-out, the final value, at equal compute, every other eval
    metric, the compute total."""
    final = final or primary
    head = list(dict.fromkeys([primary, final, final + EQUAL_COMPUTE]))
    evals = sorted(k for k in values if k.startswith("eval/") and k not in head and EQUAL_COMPUTE not in k)
    ordered = [*head, *evals, "compute/total_sec"]
    return [m for m in ordered if m in values]


def unigram_figures(plan: ComparePlan, records: list[RunRecord]) -> dict[str, float]:
    """Unigram entropies of the validation text (pre-training), cached in ``unigram.json`` under the key
    of what they depend on (``unigram.figures_key``: data and tokenizer): a report on other data, or
    with another tokenizer, recomputes them."""
    from d3ray.lab.compare.unigram import figures_key, run_validation_figures

    cache = plan.report_dir / "unigram.json"
    configs = {s.name: s.config for s in plan.runs}
    for r in records:
        cfg = configs.get(r.run_dir.name)
        if r.compute is None or cfg is None:
            continue
        key = figures_key(cfg, plan.report_dir)
        if key is None:
            return {}
        if cache.is_file():
            saved = json.loads(cache.read_text())
            if isinstance(saved, dict) and saved.get("key") == key:
                return saved["figures"]
        figures = run_validation_figures(cfg)
        if figures:
            cache.write_text(json.dumps({"key": key, "figures": figures}, indent=2))
        return figures
    return {}
