"""The total compute of a run, from its run directory: trainer and scheduler-actor seconds.

    metrics.jsonl      per step: time/step_sec, time/wait_sec (trainer rank 0)    × train.num_workers
    schedule_log.jsonl per chunk: influence_sec (× influence_actors), solver_sec,
                       score_sec (selectors), schedule_sec (curricula)            once per chunk

The unit is process-seconds (seconds a trainer worker or a scheduler actor was busy or held),
summed. It is what a run costs on a cluster where each holds its own device; on a box whose cores
they share, the figures overlap (an influence actor slows the steps it runs beside), so they are
an upper bound of core-seconds there. What is counted:

| part | from | counted |
|---|---|---|
| trainer steps | ``time/step_sec`` of every step (forward, backward, optimizer; weighting in the step) | × num_workers |
| trainer wait | ``time/wait_sec`` (waiting for a decided chunk; staleness 0 makes it real) | × num_workers |
| influence | ``influence_sec`` per chunk: the slowest influence part (D3; look-ahead too) | × influence_actors |
| solver | ``solver_sec`` per chunk (D3) | × 1 |
| scoring | ``scoring_log.jsonl``: the seconds the scoring actor (curricula, selectors, reference models) spent in each call, spread evenly over the chunks | × 1 |

Runs from before ``scoring_log.jsonl`` existed fall back to the records' ``score_sec`` (selectors)
and a curriculum's ``schedule_sec``: submit → serve latencies, which include the time a decided
chunk waited for the trainers (about one chunk of training), far above the scoring work.

Not counted: evaluation (the same for every arm), checkpointing, start-up, and work a fallback
chunk threw away (its record has no timings). Each chunk's actor seconds are charged at the chunk's
first trained step (the work was done before it trained), which gives the cumulative compute at
every step (:func:`compute_curve`), hence losses at equal compute (:func:`value_at_compute`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from d3ray.run_files import read_jsonl


@dataclass(frozen=True)
class ComputeBreakdown:
    """A run's compute, in process-seconds."""

    trainer_step_sec: float
    trainer_wait_sec: float
    influence_sec: float
    solver_sec: float
    scoring_sec: float

    @property
    def total_sec(self) -> float:
        return (self.trainer_step_sec + self.trainer_wait_sec + self.influence_sec + self.solver_sec
                + self.scoring_sec)

    def as_metrics(self) -> dict[str, float]:
        """``compute/<part>_sec`` and ``compute/total_sec``."""
        return {"compute/trainer_step_sec": self.trainer_step_sec, "compute/trainer_wait_sec": self.trainer_wait_sec,
                "compute/influence_sec": self.influence_sec, "compute/solver_sec": self.solver_sec,
                "compute/scoring_sec": self.scoring_sec, "compute/total_sec": self.total_sec}


def chunk_actor_seconds(record: dict[str, Any], influence_actors: int = 1,
                        scoring_per_chunk: float | None = None) -> dict[str, float]:
    """Scheduler-actor seconds of one schedule-log record: ``{influence, solver, scoring}``.

    ``scoring_per_chunk``: the measured scoring seconds per chunk (``scoring_log.jsonl``); None falls
    back to the record's latencies (``score_sec``, a curriculum's ``schedule_sec``), an upper bound.
    """
    if scoring_per_chunk is not None:
        scoring = scoring_per_chunk
    else:
        scoring = float(record.get("score_sec") or 0.0)
        if "curriculum" in (record.get("scheduler"), record.get("order_scheduler")):
            scoring += float(record.get("schedule_sec") or 0.0)
    return {"influence": float(record.get("influence_sec") or 0.0) * influence_actors,
            "solver": float(record.get("solver_sec") or 0.0), "scoring": scoring}


def _scoring_per_chunk(run_dir: Path, n_chunks: int) -> float | None:
    """Measured scoring seconds (``scoring_log.jsonl``) per chunk; None when the run has no such log."""
    path = run_dir / "scoring_log.jsonl"
    if not path.is_file():
        return None
    return sum(float(r.get("sec") or 0.0) for r in read_jsonl(path)) / max(n_chunks, 1)


def _step_rows(run_dir: Path) -> list[dict[str, Any]]:
    return sorted((r for r in read_jsonl(run_dir / "metrics.jsonl") if "train/loss" in r), key=lambda r: r["step"])


def run_compute(run_dir: str | Path, num_workers: int, influence_actors: int = 1) -> ComputeBreakdown:
    """The compute of the run in ``run_dir`` (see the module docstring for what is counted)."""
    run_dir = Path(run_dir)
    steps = _step_rows(run_dir)
    records = read_jsonl(run_dir / "schedule_log.jsonl")
    scoring = _scoring_per_chunk(run_dir, len(records))
    actors = {"influence": 0.0, "solver": 0.0, "scoring": 0.0}
    for record in records:
        for part, sec in chunk_actor_seconds(record, influence_actors, scoring).items():
            actors[part] += sec
    return ComputeBreakdown(
        trainer_step_sec=num_workers * sum(float(r.get("time/step_sec") or 0.0) for r in steps),
        trainer_wait_sec=num_workers * sum(float(r.get("time/wait_sec") or 0.0) for r in steps),
        influence_sec=actors["influence"], solver_sec=actors["solver"], scoring_sec=actors["scoring"])


def compute_curve(run_dir: str | Path, num_workers: int, influence_actors: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, cumulative compute after each step)``; a chunk's actor seconds count at its first step."""
    run_dir = Path(run_dir)
    rows = _step_rows(run_dir)
    records = read_jsonl(run_dir / "schedule_log.jsonl")
    scoring = _scoring_per_chunk(run_dir, len(records))
    per_chunk = {r["chunk_id"]: sum(chunk_actor_seconds(r, influence_actors, scoring).values()) for r in records}
    seen: set[int] = set()
    steps, spent = [], []
    for r in rows:
        cost = num_workers * (float(r.get("time/step_sec") or 0.0) + float(r.get("time/wait_sec") or 0.0))
        chunk = r.get("chunk_id")
        if chunk is not None and chunk not in seen:
            seen.add(chunk)
            cost += per_chunk.get(chunk, 0.0)
        steps.append(int(r["step"]))
        spent.append(cost)
    return np.asarray(steps, dtype=np.int64), np.cumsum(np.asarray(spent, dtype=np.float64))


def eval_curve(run_dir: str | Path, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, values)`` of ``metric`` at every evaluation of the run (the last one is the final)."""
    points: dict[int, float] = {}
    for r in read_jsonl(Path(run_dir) / "metrics.jsonl"):
        value = r.get(metric)
        if "train/loss" not in r and value is not None and np.isfinite(value):
            points[int(r["step"])] = float(value)
    steps = sorted(points)
    return np.asarray(steps, dtype=np.int64), np.asarray([points[s] for s in steps], dtype=np.float64)


@dataclass(frozen=True)
class AtCompute:
    """A metric read off a run's eval curve at a compute budget."""

    value: float
    """The interpolated value; NaN when the budget falls before the first evaluation."""
    within_budget: bool
    """The run's whole compute fits the budget: ``value`` is its final value (it stopped early)."""


def value_at_compute(eval_steps: np.ndarray, eval_values: np.ndarray, curve_steps: np.ndarray,
                     curve_compute: np.ndarray, budget: float) -> AtCompute:
    """The metric at the point where the run's cumulative compute equals ``budget``.

    Linear in compute between the two evaluations around it. A run whose total compute is at most
    the budget gives its final value (marked ``within_budget``: it could have trained further); a
    budget before the first evaluation gives NaN (evaluate more often: ``train.eval_every``).
    """
    if len(eval_steps) == 0 or len(curve_steps) == 0:
        return AtCompute(float("nan"), False)
    spent = np.interp(eval_steps, curve_steps, curve_compute)  # cumulative compute at each evaluation
    if budget >= curve_compute[-1]:
        return AtCompute(float(eval_values[-1]), True)
    if budget < spent[0]:
        return AtCompute(float("nan"), False)
    return AtCompute(float(np.interp(budget, spent, eval_values)), False)
