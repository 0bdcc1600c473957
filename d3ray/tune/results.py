"""The sweep's outputs: a results table (CSV + console) and the best trial's config as YAML.

    <sweep dir>/results.csv        one row per trial: id, status, the varied keys, the metric, steps, ...
    <sweep dir>/best_config.yaml   the best trial's resolved RunConfig (``d3ray pretrain --config`` ready)

The best trial is the best metric among the trials that ran all their steps; trials stopped early
by ASHA compete only when none finished (their metric is from fewer steps). Non-finite metrics
never rank. A ``gamma_changes_order`` column appears when the trials differ in γ: under the Taylor
estimators γ only scales S by γ²/2 (docs/design/method.md §6), so the order cannot change with it.
"""

from __future__ import annotations

import csv
import io
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from d3ray.config import RunConfig
from d3ray.config_loading import to_dict
from d3ray.influence.config import InfluenceConfig
from d3ray.schedule.config import StagedScheduleConfig

logger = logging.getLogger(__name__)

#: Final-metric columns copied from a trial's last report when present.
EXTRA_COLUMNS = ("final_loss", "tokens_per_sec", "wall_seconds")
GAMMA_NOTE = (
    "gamma_changes_order: under the Taylor estimators (first_order, fisher, gnb, hutchinson) γ only "
    "scales S by γ²/2, so it cannot change the order, and with preconditioner adam γ is unused; only the "
    "lookahead estimator's order with the plain step depends on γ."
)


@dataclass
class TrialRow:
    """One trial of the results table."""

    trial_id: str
    status: str
    """``completed``, ``stopped early`` (ASHA), ``error``, or ``unfinished`` (the sweep was interrupted)."""
    params: dict[str, Any]
    """The varied keys' values (dotted keys)."""
    metric: float | None
    step: int | None
    """Training step of the last report (where ``metric`` was measured)."""
    steps: int
    """The trial's ``train.steps``."""
    cfg: RunConfig
    extras: dict[str, Any] = field(default_factory=dict)
    error: str = ""


def gamma_changes_order(cfg: RunConfig) -> str:
    """``yes`` (exact look-ahead with the plain step), ``no`` (Taylor estimators: γ only scales S; or the
    AdamW step, where γ is unused) or ``n/a`` (the scheduler has no γ), read from the ``influence`` field the
    schedule declares (D3's), or its ``order`` stage declares under a select, weight or mix scheduler."""
    schedule = cfg.schedule
    order = schedule.order if isinstance(schedule, StagedScheduleConfig) else schedule
    influence = getattr(order, "influence", None)
    if not isinstance(influence, InfluenceConfig):
        return "n/a"
    return "yes" if influence.gamma_changes_order else "no"


def _finite(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def trial_row(
    trial_id: str,
    params: dict[str, Any],
    cfg: RunConfig,
    last: dict[str, Any] | None,
    error: BaseException | None,
    metric: str,
    tune_status: str = "TERMINATED",
) -> TrialRow:
    """A table row from a trial's last reported metrics (``last``), its error and Tune's status of it
    (``TERMINATED``, ``ERROR``; ``PENDING``/``RUNNING``/``PAUSED`` when the sweep was interrupted)."""
    last = last or {}
    step = last.get("step")
    step = int(step) if _finite(step) is not None else None
    if error is not None or tune_status == "ERROR":
        status = "error"
    elif tune_status != "TERMINATED":
        status = "unfinished"
    elif step is not None and step >= cfg.train.steps:
        status = "completed"
    else:
        status = "stopped early"
    message = ""
    if error is not None:
        message = (str(error).strip().splitlines() or [type(error).__name__])[-1][:300]
    extras = {k: _finite(last.get(k)) for k in EXTRA_COLUMNS}
    return TrialRow(
        trial_id, status, params, _finite(last.get(metric)), step, cfg.train.steps, cfg, extras, message
    )


def rank_rows(rows: Sequence[TrialRow], mode: str) -> list[TrialRow]:
    """Rows best first: finished trials by metric, then early-stopped ones by metric, then the rest."""
    sign = 1.0 if mode == "min" else -1.0

    def key(row: TrialRow) -> tuple:
        tier = (
            0 if row.status == "completed" and row.metric is not None else 1 if row.metric is not None else 2
        )
        return (tier, sign * row.metric if row.metric is not None else 0.0, row.trial_id)

    return sorted(rows, key=key)


def best_row(rows: Sequence[TrialRow], mode: str) -> TrialRow | None:
    """The best trial with a finite metric (see :func:`rank_rows`), or None."""
    ranked = [r for r in rank_rows(rows, mode) if r.metric is not None]
    return ranked[0] if ranked else None


def table(rows: Sequence[TrialRow], keys: Sequence[str], metric: str) -> tuple[list[str], list[list[Any]]]:
    """Header and cells of the results table (rows as given)."""
    show_gamma = any(k.endswith("gamma") for k in keys)  # the sweep varies γ
    header = ["trial_id", "status", *keys, metric, "step", "train.steps", *EXTRA_COLUMNS]
    if show_gamma:
        header.append("gamma_changes_order")
    header += ["run_dir", "error"]
    cells = []
    for r in rows:
        line = [
            r.trial_id,
            r.status,
            *(_cell(r.params.get(k)) for k in keys),
            r.metric,
            r.step,
            r.steps,
            *(r.extras.get(k) for k in EXTRA_COLUMNS),
        ]
        if show_gamma:
            line.append(gamma_changes_order(r.cfg))
        line += [str(r.cfg.run_dir), r.error]
        cells.append(line)
    return header, cells


def _cell(value: Any) -> Any:
    if isinstance(value, dict):
        return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return value


def results_csv(rows: Sequence[TrialRow], keys: Sequence[str], metric: str) -> str:
    """The results table as CSV text (empty cells for missing values)."""
    header, cells = table(rows, keys, metric)
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(header)
    for line in cells:
        writer.writerow(["" if v is None else v for v in line])
    return out.getvalue()


def format_table(rows: Sequence[TrialRow], keys: Sequence[str], metric: str) -> str:
    """The results table for the console (fixed-width columns; run_dir left out)."""
    header, cells = table(rows, keys, metric)
    drop = {header.index("run_dir")}
    if not any(r.error for r in rows):
        drop.add(header.index("error"))
    header = [h for i, h in enumerate(header) if i not in drop]
    text = [[_fmt(v) for i, v in enumerate(line) if i not in drop] for line in cells]
    widths = [max(len(h), *(len(t[i]) for t in text)) if text else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(t, widths, strict=True)) for t in text]
    if "gamma_changes_order" in header and any(gamma_changes_order(r.cfg) == "no" for r in rows):
        lines.append("note: " + GAMMA_NOTE)
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e5 else f"{value:.3e}"
    return str(_cell(value))


def best_config_yaml(row: TrialRow, sweep_name: str, metric: str) -> str:
    """The best trial's RunConfig as YAML, renamed ``<sweep>-best`` so that it starts a fresh run."""
    data = to_dict(row.cfg)
    data["name"] = f"{sweep_name}-best"
    data["output_dir"] = "runs"
    params = ", ".join(f"{k}={_cell(v)}" for k, v in row.params.items())
    header = (
        f"# Best trial of sweep {sweep_name!r}: {row.trial_id} ({row.status}), {metric}={row.metric:.6g} "
        f"at step {row.step}.\n# Its parameters: {params or '(none varied)'}\n"
        f"# Its run directory: {row.cfg.run_dir}\n# Train it again: d3ray pretrain --config best_config.yaml\n"
    )
    return header + yaml.safe_dump(data, sort_keys=False)
