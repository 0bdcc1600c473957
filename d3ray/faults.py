"""Fault drills: the one test hook of d3ray, and its one seam.

Write ``<run_dir>/faults.json`` before a run and the named faults fire, each once (a marker file
under ``<run_dir>/.faults/`` survives the process it kills, so the restarted process goes on):

    {"trainer_exit_at_step": 10,       trainer rank 0 exits (os._exit) before training this step
     "influence_exit_at_chunk": 2,     influence actor 0 exits when asked to score this chunk
     "solver_exit_at_chunk": 1,        the solver actor exits when asked to order this chunk
     "influence_nan_batches": [5],     these global batch ids reach the influence estimate (the influence
                                       actors, or the trainer ranks that sketch) with every label masked,
                                       so their loss is NaN (as a corrupt batch's would be)
     "trainer_exit_while_scoring_chunk": 3,  trainer rank 0 exits after sketching the first batch of
                                       this chunk (schedule.placement in_trainer)
     "census_exit_at_branch": "random_1",  the census worker asked to train the branch of this name
                                       (the first chunk's) exits, in ``<census out>/faults.json``
     "influence_hold_at_chunk": 2}     influence actor 0 holds (once) while scoring this chunk, until
                                       the file release_influence_hold_2 appears under .faults/; the
                                       marker influence_hold_at_chunk_2 says it is holding (so that a
                                       drill can remove its node at a known point)

The seam: production code calls :func:`inject` at the named points below, with the run directory and
what it is doing, and knows nothing else of drills (no drill classes, no drill parameters); without a
``faults.json`` the call returns at once:

    point             called by                                   context                       drills acting there
    "train_step"      every trainer rank, before a step           rank, step                    trainer_exit_at_step
    "sketch_batch"    every trainer rank, before sketching a      rank, chunk_id, position,     influence_nan_batches,
                      batch (schedule.placement in_trainer)       batch_id, labels              trainer_exit_while_scoring_chunk
    "influence_chunk" an influence actor, before scoring a chunk  actor, chunk_id               influence_exit_at_chunk,
                                                                                                influence_hold_at_chunk
    "influence_batch" an influence actor, reading a batch         batch_id, labels              influence_nan_batches
    "solve"           a solver actor, before ordering a problem   key (the chunk id)            solver_exit_at_chunk
    "census_branch"   a census worker, before training a branch   names (the branch's orders)   census_exit_at_branch

``labels`` (the batch's (b, T) label array) is masked in place. The exits and holds act in one process
only (trainer rank 0, influence actor 0, the census worker given the named branch); the masking on every
process that sees the batch.

The tests drive every recovery path through it (``tests/integration/test_d3_pipeline.py``), and an
operator can run the same drills on a real cluster. Nothing else in d3ray kills a process on purpose.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

PLAN_FILE = "faults.json"


@dataclass(frozen=True)
class FaultPlan:
    """The drills of one run (all off by default)."""

    trainer_exit_at_step: int | None = None
    influence_exit_at_chunk: int | None = None
    solver_exit_at_chunk: int | None = None
    influence_nan_batches: list[int] = field(default_factory=list)
    influence_hold_at_chunk: int | None = None
    trainer_exit_while_scoring_chunk: int | None = None
    census_exit_at_branch: str | None = None


def load_plan(run_dir: str | Path | None) -> FaultPlan:
    """The run's fault plan: ``<run_dir>/faults.json`` if present, else no faults."""
    if run_dir is None:
        return FaultPlan()
    path = Path(run_dir) / PLAN_FILE
    try:
        stat = path.stat()
    except FileNotFoundError:
        return FaultPlan()
    return _read_plan(str(path), stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=8)
def _read_plan(path: str, mtime_ns: int, size: int) -> FaultPlan:
    """The plan in ``path``, parsed once per version of the file (``inject`` runs every step)."""
    data = json.loads(Path(path).read_text())
    unknown = set(data) - set(FaultPlan.__dataclass_fields__)
    if unknown:
        raise ValueError(f"{path}: unknown fault(s) {sorted(unknown)}; known: {sorted(FaultPlan.__dataclass_fields__)}")
    return FaultPlan(**data)


def inject(run_dir: str | Path | None, point: str, **context: Any) -> None:
    """Run the drills of the run's plan that act at ``point`` (the table in the module docstring).

    A no-op when ``run_dir`` is None or holds no ``faults.json``.

    Raises:
        ValueError: an unknown point, or a plan with an unknown fault.
    """
    if point not in _POINTS:
        raise ValueError(f"unknown fault-injection point {point!r}; known: {sorted(_POINTS)}")
    plan = load_plan(run_dir)
    if plan != FaultPlan():
        _POINTS[point](plan, Path(run_dir), **context)  # type: ignore[arg-type]  # not None: a plan was read


def _mask(plan: FaultPlan, batch_id: int, labels: Any) -> None:
    if batch_id in plan.influence_nan_batches:
        labels[:] = -100  # mean over zero scored tokens: NaN loss, as a corrupt batch would give


def _train_step(plan: FaultPlan, run_dir: Path, *, rank: int, step: int) -> None:
    if rank == 0 and plan.trainer_exit_at_step == step:
        exit_once(run_dir, f"trainer_exit_at_step_{step}", f"trainer rank 0 exits at step {step}")


def _sketch_batch(plan: FaultPlan, run_dir: Path, *, rank: int, chunk_id: int, position: int, batch_id: int,
                  labels: Any) -> None:
    if rank == 0 and position > 0 and plan.trainer_exit_while_scoring_chunk == chunk_id:
        exit_once(run_dir, f"trainer_exit_while_scoring_chunk_{chunk_id}",
                  f"trainer rank 0 exits while sketching batch {position} of chunk {chunk_id}")
    _mask(plan, batch_id, labels)


def _influence_chunk(plan: FaultPlan, run_dir: Path, *, actor: int, chunk_id: int) -> None:
    if actor != 0:
        return
    if plan.influence_exit_at_chunk == chunk_id:
        exit_once(run_dir, f"influence_exit_at_chunk_{chunk_id}", f"influence actor exits while scoring chunk {chunk_id}")
    if plan.influence_hold_at_chunk == chunk_id:
        hold_once(run_dir, f"influence_hold_at_chunk_{chunk_id}", f"release_influence_hold_{chunk_id}",
                  f"influence actor holds while scoring chunk {chunk_id}")


def _influence_batch(plan: FaultPlan, run_dir: Path, *, batch_id: int, labels: Any) -> None:
    _mask(plan, batch_id, labels)


def _solve(plan: FaultPlan, run_dir: Path, *, key: Any) -> None:
    if plan.solver_exit_at_chunk is not None and key == plan.solver_exit_at_chunk:
        exit_once(run_dir, f"solver_exit_at_chunk_{key}", f"solver actor exits while ordering chunk {key}")


def _census_branch(plan: FaultPlan, run_dir: Path, *, names: tuple[str, ...]) -> None:
    if plan.census_exit_at_branch is not None and plan.census_exit_at_branch in names:
        exit_once(run_dir, f"census_exit_at_branch_{plan.census_exit_at_branch}",
                  f"census worker exits before training branch {plan.census_exit_at_branch}")


_POINTS: dict[str, Callable[..., None]] = {
    "train_step": _train_step,
    "sketch_batch": _sketch_batch,
    "influence_chunk": _influence_chunk,
    "influence_batch": _influence_batch,
    "solve": _solve,
    "census_branch": _census_branch,
}


def write_plan(run_dir: str | Path, plan: FaultPlan) -> Path:
    """Write ``plan`` as the run's ``faults.json`` (what a drill, or an operator, does before a run)."""
    path = Path(run_dir) / PLAN_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({k: v for k, v in plan.__dict__.items() if v not in (None, [])}))
    return path


def marker(run_dir: str | Path, name: str) -> Path:
    """The marker file of drill ``name`` (exists once the drill has fired)."""
    return Path(run_dir) / ".faults" / name


def fire_once(run_dir: str | Path, name: str, what: str) -> bool:
    """Mark drill ``name`` as fired and log ``what``; False if it had fired already (then do nothing)."""
    path = marker(run_dir, name)
    if path.exists():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    logger.warning("fault drill %s: %s", name, what)
    return True


def exit_once(run_dir: str | Path, name: str, what: str) -> None:
    """Exit this process (``os._exit(1)``, no cleanup, as a crash) unless drill ``name`` already fired."""
    if fire_once(run_dir, name, what):
        os._exit(1)


def hold_once(run_dir: str | Path, name: str, release: str, what: str, poll_s: float = 0.05) -> None:
    """Block until ``.faults/<release>`` exists, unless drill ``name`` already fired (then return at once)."""
    if fire_once(run_dir, name, what):
        while not marker(run_dir, release).exists():
            time.sleep(poll_s)
