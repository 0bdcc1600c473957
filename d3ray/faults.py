"""Fault drills: the one test hook of d3ray.

Write ``<run_dir>/faults.json`` before a run and the named faults fire, each once (a marker file
under ``<run_dir>/.faults/`` survives the process it kills, so the restarted process goes on):

    {"trainer_exit_at_step": 10,       trainer rank 0 exits (os._exit) before training this step
     "influence_exit_at_chunk": 2,     influence actor 0 exits when asked to score this chunk
     "solver_exit_at_chunk": 1,        the solver actor exits when asked to order this chunk
     "influence_nan_batches": [5],     these global batch ids reach the influence actors with every
                                       label masked, so their loss is NaN (as a corrupt batch's would be)
     "trainer_exit_while_scoring_chunk": 3,  trainer rank 0 exits after sketching the first batch of
                                       this chunk (influence_placement in_trainer)
     "influence_hold_at_chunk": 2}     influence actor 0 holds (once) while scoring this chunk, until
                                       the file release_influence_hold_2 appears under .faults/; the
                                       marker influence_hold_at_chunk_2 says it is holding (so that a
                                       drill can remove its node at a known point)

The tests drive every recovery path through it (``tests/integration/test_d3_pipeline.py``), and an
operator can run the same drills on a real cluster. Nothing else in d3ray kills a process on purpose.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

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


def load_plan(run_dir: str | Path | None) -> FaultPlan:
    """The run's fault plan: ``<run_dir>/faults.json`` if present, else no faults."""
    if run_dir is None:
        return FaultPlan()
    path = Path(run_dir) / PLAN_FILE
    if not path.exists():
        return FaultPlan()
    data = json.loads(path.read_text())
    unknown = set(data) - set(FaultPlan.__dataclass_fields__)
    if unknown:
        raise ValueError(f"{path}: unknown fault(s) {sorted(unknown)}; known: {sorted(FaultPlan.__dataclass_fields__)}")
    return FaultPlan(**data)


def write_plan(run_dir: str | Path, plan: FaultPlan) -> Path:
    """Write ``plan`` as the run's ``faults.json`` (for tests and drills)."""
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
