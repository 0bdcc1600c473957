"""The fault drills' one seam (``d3ray.faults.inject``): a no-op without ``faults.json``; with one, each drill acts
at its point only, in the process it names, and once (its marker outlives the process it kills). The exits run in a
child process, since a drill's exit is ``os._exit``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from d3ray import faults
from d3ray.faults import FaultPlan, inject, marker, write_plan

REPO = Path(__file__).resolve().parents[2]


def _inject_in_child(run_dir: Path, point: str, **context) -> int:
    """Exit status of a child process that calls ``inject(run_dir, point, **context)`` and then exits 0."""
    code = f"from d3ray.faults import inject; inject({str(run_dir)!r}, {point!r}, **{context!r})"
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, timeout=120).returncode


def test_inject_without_a_plan_changes_nothing(tmp_path):
    labels = np.arange(6).reshape(2, 3)
    inject(tmp_path, "influence_batch", batch_id=5, labels=labels)
    inject(None, "sketch_batch", rank=0, chunk_id=3, position=1, batch_id=5, labels=labels)
    assert labels.tolist() == [[0, 1, 2], [3, 4, 5]] and not (tmp_path / ".faults").exists()


@pytest.mark.parametrize("point", ["influence_batch", "sketch_batch"])
def test_inject_masks_the_labels_of_the_planned_batches_only(tmp_path, point):
    write_plan(tmp_path, FaultPlan(influence_nan_batches=[5]))
    extra = {"rank": 1, "chunk_id": 0, "position": 1} if point == "sketch_batch" else {}
    planned, other = np.ones((2, 3), dtype=np.int64), np.ones((2, 3), dtype=np.int64)
    inject(tmp_path, point, batch_id=5, labels=planned, **extra)
    inject(tmp_path, point, batch_id=4, labels=other, **extra)
    assert (planned == -100).all() and (other == 1).all()


def test_inject_unknown_point_raises_naming_the_known_ones(tmp_path):
    with pytest.raises(ValueError, match="unknown fault-injection point 'solver'.*'solve'"):
        inject(tmp_path, "solver", key=1)


def test_inject_reads_a_rewritten_plan(tmp_path):
    write_plan(tmp_path, FaultPlan(influence_nan_batches=[1]))
    inject(tmp_path, "influence_batch", batch_id=2, labels=(first := np.ones(2)))
    write_plan(tmp_path, FaultPlan(influence_nan_batches=[1, 2]))
    inject(tmp_path, "influence_batch", batch_id=2, labels=(second := np.ones(2)))
    assert (first == 1).all() and (second == -100).all()


def test_solver_drill_exits_at_its_chunk_once(tmp_path):
    write_plan(tmp_path, FaultPlan(solver_exit_at_chunk=1))
    assert _inject_in_child(tmp_path, "solve", key=0) == 0
    assert _inject_in_child(tmp_path, "solve", key=1) == 1 and marker(tmp_path, "solver_exit_at_chunk_1").exists()
    assert _inject_in_child(tmp_path, "solve", key=1) == 0  # the restarted actor goes on


def test_trainer_drills_exit_rank_0_only_at_their_step_and_batch(tmp_path):
    write_plan(tmp_path, FaultPlan(trainer_exit_at_step=3, trainer_exit_while_scoring_chunk=2))
    assert _inject_in_child(tmp_path, "train_step", rank=1, step=3) == 0
    assert _inject_in_child(tmp_path, "train_step", rank=0, step=2) == 0
    assert _inject_in_child(tmp_path, "train_step", rank=0, step=3) == 1
    labels = np.ones(2, dtype=np.int64)
    inject(tmp_path, "sketch_batch", rank=0, chunk_id=2, position=0, batch_id=0, labels=labels)  # the first batch: on
    assert _inject_in_child(tmp_path, "sketch_batch", rank=1, chunk_id=2, position=1, batch_id=1, labels=[0]) == 0
    assert _inject_in_child(tmp_path, "sketch_batch", rank=0, chunk_id=2, position=1, batch_id=1, labels=[0]) == 1
    assert marker(tmp_path, "trainer_exit_while_scoring_chunk_2").exists()


def test_influence_exit_acts_in_actor_0_only(tmp_path):
    write_plan(tmp_path, FaultPlan(influence_exit_at_chunk=2))
    assert _inject_in_child(tmp_path, "influence_chunk", actor=1, chunk_id=2) == 0
    assert _inject_in_child(tmp_path, "influence_chunk", actor=0, chunk_id=1) == 0
    assert _inject_in_child(tmp_path, "influence_chunk", actor=0, chunk_id=2) == 1


def test_plan_with_an_unknown_fault_raises_naming_it(tmp_path):
    (tmp_path / faults.PLAN_FILE).write_text('{"solver_exit_at_chunks": 1}')
    with pytest.raises(ValueError, match="solver_exit_at_chunks"):
        inject(tmp_path, "solve", key=1)


def faults_uses_outside_the_seam(root: Path) -> list[str]:
    """``file:line name`` of every use of ``d3ray.faults`` other than ``inject`` in the package under ``root``
    (the module itself excepted): attribute uses ``faults.X`` and ``from d3ray.faults import X``."""
    import ast

    found = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "faults.py" and path.parent == root:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "faults"
                    and node.attr != "inject"):
                found.append(f"{path.relative_to(root)}:{node.lineno} {node.attr}")
            if isinstance(node, ast.ImportFrom) and node.module == "d3ray.faults":
                found += [f"{path.relative_to(root)}:{node.lineno} {a.name}" for a in node.names if a.name != "inject"]
    return sorted(found)


def test_faults_uses_outside_the_seam_finds_a_drill_read_off_the_plan(tmp_path):
    (tmp_path / "worker.py").write_text("from d3ray import faults\n\ndef f(d):\n    faults.inject(d, 'solve', key=1)\n")
    assert faults_uses_outside_the_seam(tmp_path) == []
    (tmp_path / "trainer.py").write_text("from d3ray import faults\nplan = faults.load_plan('d')\n"
                                         "from d3ray.faults import exit_once\n")
    assert faults_uses_outside_the_seam(tmp_path) == ["trainer.py:2 load_plan", "trainer.py:3 exit_once"]


def test_production_code_reaches_the_drills_only_through_inject():
    assert faults_uses_outside_the_seam(REPO / "d3ray") == []
