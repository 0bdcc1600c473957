"""Run-directory logs written by trainer rank 0: metrics, trained samples, schedule decisions.

    <run_dir>/metrics.jsonl   one row per step (and per eval), keys ``stage/name_unit``
    <run_dir>/metrics.csv     the per-step rows as CSV, for spreadsheets and pandas
    <run_dir>/domains.csv     per trained chunk and domain: its mixture weight (mixers), samples, mean
                              training loss (the ``mix/<domain>``, ``train/loss/<domain>`` rows), long format
    <run_dir>/tb/             TensorBoard scalars (``train.report_to`` has ``tensorboard``, the default)
    W&B / MLflow runs         the same rows, when ``train.report_to`` lists them (``tracking.py``)
    <run_dir>/samples.jsonl   per step: chunk id, position, the global batch's sample ids
    <run_dir>/schedule_log.jsonl  per chunk: order, scheduler record, trainer wait, fallback

On resume every JSONL/CSV file is rolled back to the checkpoint (rows past it are removed),
so the files always describe exactly one uninterrupted history.
"""

from __future__ import annotations

import csv
import json
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np

from d3ray.run_files import read_jsonl

logger = logging.getLogger(__name__)

STEP_FIELDS = ["step", "chunk_id", "train/loss", "train/lr", "train/grad_norm", "data/tokens",
               "data/tokens_per_sec", "time/step_sec", "time/wait_sec"]
DOMAIN_FIELDS = ["step", "chunk_id", "domain", "mix", "samples", "train_loss"]


def domain_rows(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The long-format ``domains.csv`` rows of one per-chunk metrics row (``mix/<d>``, ``train/loss/<d>``,
    ``data/samples/<d>``); [] for any other row."""
    domains = sorted({k.split("/", 2)[-1] for k in row if k.startswith(("mix/", "train/loss/", "data/samples/"))})
    return [{"step": row.get("step"), "chunk_id": row.get("chunk_id"), "domain": d, "mix": row.get(f"mix/{d}"),
             "samples": row.get(f"data/samples/{d}"), "train_loss": row.get(f"train/loss/{d}")} for d in domains]


def chunk_domain_metrics(domains: Any, losses: np.ndarray, mixture: dict[str, float] | None) -> dict[str, float]:
    """Per-domain figures of one trained chunk: ``train/loss/<d>`` (mean per-sample loss), ``data/samples/<d>``
    and, when the chunk was drawn by a mixer, ``mix/<d>`` (its weight, 0 included).

    Args:
        domains: the domain of each trained sample (flat).
        losses: (n,) the samples' training losses, in the same order (NaN: not trained).
        mixture: the chunk's mixture, or None.
    """
    out: dict[str, float] = {}
    flat = np.asarray(losses, dtype=np.float64).reshape(-1)
    labels = np.asarray(list(domains), dtype=object).reshape(-1)
    for d in sorted(set(labels.tolist()) | set(mixture or {})):
        mine = flat[(labels == d) & np.isfinite(flat)]
        out[f"data/samples/{d}"] = int(len(mine))
        if len(mine):
            out[f"train/loss/{d}"] = float(mine.mean())
    for d, w in (mixture or {}).items():
        out[f"mix/{d}"] = float(w)
    return out


def rollback_jsonl(path: Path, keep: Any) -> None:
    """Keep only rows for which ``keep(row)`` is true (rewrite in place)."""
    rows = [r for r in read_jsonl(path) if keep(r)]
    if path.exists():
        _write_jsonl(path, rows)


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")
    tmp.replace(path)


def _finite(x: Any) -> Any:
    return x if not isinstance(x, float) or math.isfinite(x) else None


class RunLogs:
    """Rank-0 writer of the run directory's logs (rolls back to ``resume_step`` on creation)."""

    def __init__(self, run_dir: Path, resume_step: int, resume_chunk: int,
                 report_to: list[str] | tuple[str, ...] = ("tensorboard",), run_name: str = "",
                 config: dict[str, Any] | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self.samples_path = self.run_dir / "samples.jsonl"
        self.schedule_path = self.run_dir / "schedule_log.jsonl"
        self.csv_path = self.run_dir / "metrics.csv"
        self.domains_csv_path = self.run_dir / "domains.csv"
        rollback_jsonl(self.metrics_path, lambda r: r.get("step", 0) <= resume_step)
        rollback_jsonl(self.samples_path, lambda r: r["step"] <= resume_step)
        rollback_jsonl(self.schedule_path, lambda r: r["chunk_id"] < resume_chunk)
        self._rewrite_csv()
        self._next_step = resume_step + 1
        self._tb = None
        if "tensorboard" in report_to:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.run_dir / "tb"), purge_step=resume_step + 1)
        self._trackers = None
        if set(report_to) - {"tensorboard"}:
            from d3ray.train.tracking import Trackers

            self._trackers = Trackers(report_to, self.run_dir, run_name or self.run_dir.name, config)

    def _rewrite_csv(self) -> None:
        rows = read_jsonl(self.metrics_path)
        with open(self.csv_path, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=STEP_FIELDS, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(r for r in rows if "train/loss" in r)
        with open(self.domains_csv_path, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=DOMAIN_FIELDS)
            writer.writeheader()
            writer.writerows(d for r in rows for d in domain_rows(r))

    def log_metrics(self, row: dict[str, Any]) -> None:
        row = {k: _finite(v) for k, v in row.items()}
        with open(self.metrics_path, "a") as fh:
            fh.write(json.dumps(row) + "\n")
        if "train/loss" in row:
            with open(self.csv_path, "a", newline="") as fh:
                csv.DictWriter(fh, fieldnames=STEP_FIELDS, extrasaction="ignore").writerow(row)
        per_domain = domain_rows(row)
        if per_domain:
            with open(self.domains_csv_path, "a", newline="") as fh:
                csv.DictWriter(fh, fieldnames=DOMAIN_FIELDS).writerows(per_domain)
        if self._tb is not None:
            for key, value in row.items():
                if key != "step" and isinstance(value, (int, float)) and value is not None:
                    self._tb.add_scalar(key, value, row["step"])
        if self._trackers is not None:
            self._trackers.log(row)

    def log_samples(self, step: int, chunk_id: int, position: int, sample_ids: tuple[str, ...],
                    domains: tuple[str, ...]) -> None:
        self._next_step = step + 1
        with open(self.samples_path, "a") as fh:
            fh.write(json.dumps({"step": step, "chunk_id": chunk_id, "position": position,
                                 "sample_ids": list(sample_ids), "domains": list(domains)}) + "\n")

    def log_schedule(self, record: dict[str, Any]) -> None:
        with open(self.schedule_path, "a") as fh:
            fh.write(json.dumps({k: _finite(v) for k, v in record.items()}) + "\n")

    def log_chunk(self, chunk: Any, wait_s: float) -> None:
        """The schedule-log row of a decided chunk (at its first step), its S, and its skipped samples."""
        decision = chunk.decision
        skipped = {reason: len(ids) for reason, ids in chunk.skipped.items()}
        self.log_schedule({"chunk_id": chunk.chunk_id, "epoch": chunk.epoch, "order": list(decision.order),
                           "fallback": decision.fallback, "trainer_wait_sec": wait_s,
                           "weights_version": chunk.weights_version, "trained_samples": sum(map(len, chunk.sample_ids)),
                           "skipped": skipped, **decision.record,
                           **({"mixture": dict(chunk.mixture)} if getattr(chunk, "mixture", None) else {})})
        predicted = {f"schedule/{k}": decision.record[k] for k in ("predicted_loss_change_vs_stream_nats",
                     "predicted_loss_change_vs_random_nats") if decision.record.get(k) is not None}
        if predicted:  # the chunk's row in the metrics too (its first step), beside the schedule log's
            self.log_metrics({"step": self._next_step, "chunk_id": chunk.chunk_id, **predicted})
        if decision.matrix is not None:  # only when asked (schedule.save_matrices)
            (self.run_dir / "influence").mkdir(exist_ok=True)
            np.save(self.run_dir / "influence" / f"S_{chunk.chunk_id:06d}.npy", decision.matrix)
        if chunk.skipped:  # keyed by the chunk's first step, so a resume before it rolls it back
            with open(self.samples_path, "a") as fh:
                fh.write(json.dumps({"step": self._next_step, "chunk_id": chunk.chunk_id,
                                     "skipped": {r: list(ids) for r, ids in chunk.skipped.items()}}) + "\n")

    def close(self) -> None:
        if self._tb is not None:
            self._tb.flush()
            self._tb.close()
        if self._trackers is not None:
            self._trackers.close()


def progress_line(step: int, steps: int, loss: float, tokens_per_sec: float, lr: float, wait_s: float,
                  extra: str = "") -> str:
    """``step 120/400 | loss 2.4312 | tok/s 12.1k | lr 3.00e-03 | wait 0.01s``: one line per interval."""
    tps = f"{tokens_per_sec / 1e6:.2f}M" if tokens_per_sec >= 1e6 else f"{tokens_per_sec / 1e3:.1f}k"
    line = f"step {step}/{steps} | loss {loss:.4f} | tok/s {tps} | lr {lr:.2e} | wait {wait_s:.2f}s"
    return line + (f" | {extra}" if extra else "")

