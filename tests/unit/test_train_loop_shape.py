"""The training loop stays readable top to bottom (issue 48 item 4): ``train_loop_per_worker`` is short and
hands each cadence to its owner instead of doing it inline; the trainer rank travels as one value."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from d3ray.train.trainer_rank import TrainerRank

LOOP = Path(__file__).resolve().parents[2] / "d3ray" / "train" / "loop.py"


def _loop_function() -> ast.FunctionDef:
    tree = ast.parse(LOOP.read_text())
    return next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "train_loop_per_worker")


def _called_names(node: ast.AST) -> set[str]:
    names = set()
    for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
        f = call.func
        names.add(f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", ""))
    return names


def test_train_loop_per_worker_is_at_most_120_lines():
    fn = _loop_function()
    assert fn.end_lineno - fn.lineno + 1 <= 120


def test_the_loop_hands_checkpoints_evals_and_step_logs_to_their_owners():
    called = _called_names(_loop_function())
    assert {"chunk_ended", "save_if_due", "after_step", "step"} <= called
    # the cadences and their side effects live in checkpointer.py, evaluator.py, step_logger.py
    assert not called & {"checkpoint_due", "save_checkpoint", "report", "evaluate", "log_metrics", "print"}


def test_trainer_rank_is_one_frozen_value():
    trainer = TrainerRank(engine=None, rank=1, world=2, zero_stage=3)
    assert not trainer.is_rank0 and TrainerRank(None, 0, 2, 3).is_rank0
    with pytest.raises(AttributeError):
        trainer.rank = 0  # frozen


@pytest.mark.parametrize("rank, world, zero_stage, message", [
    (2, 2, 0, "rank 2 is not one of the 2 trainer ranks"),
    (-1, 1, 0, "rank -1 is not one of the 1 trainer ranks"),
    (0, 1, 4, "zero_stage=4 must be 0, 1, 2 or 3"),
])
def test_trainer_rank_refuses_a_rank_outside_the_world_or_an_unknown_zero_stage(rank, world, zero_stage, message):
    with pytest.raises(ValueError, match=message):
        TrainerRank(engine=None, rank=rank, world=world, zero_stage=zero_stage)
