"""``d3ray solve`` on small matrix files written by the tests, with hand-checked optima."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from d3ray.errors import UserError
from d3ray.solver import command


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="d3ray")
    command.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


# c[i][j] = weight collected when i comes before j (the diagonal 9 is ignored). Best order 2, 0, 1:
# forward c20 + c21 + c01 = 4 + 5 + 6 = 15, backward c02 + c12 + c10 = 1 + 2 + 0 = 3 (checked by hand
# over all 6 orders; the next best, 0, 2, 1, collects 12).
TEXT = """3
0 6 1
0 0 2
4 5 9
"""


@pytest.mark.parametrize("solver", ["ils", "exact", "rsr", "greedy_insertion"])
def test_solve_text_matrix_prints_hand_checked_optimum(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], solver: str
) -> None:
    path = tmp_path / "m.txt"
    path.write_text(TEXT)
    assert _run(["solve", str(path), "--solver", solver, "--seed", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["order"] == [2, 0, 1]
    assert out["forward_weight"] == 15.0
    assert out["backward_weight"] == 3.0
    assert out["seconds"] >= 0


def test_solve_npy_matrix_with_time_budget(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(0)
    hidden = rng.permutation(25)
    C = np.zeros((25, 25))
    for a in range(25):
        for b in range(a + 1, 25):
            C[hidden[a], hidden[b]] = 1.0 + rng.random()
    np.save(tmp_path / "m.npy", C)
    assert _run(["solve", str(tmp_path / "m.npy"), "--time-budget", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["order"] == hidden.tolist()
    assert out["backward_weight"] == 0.0
    assert out["forward_weight"] == pytest.approx(C.sum())


def test_solve_exact_too_large_is_a_user_error(tmp_path: Path) -> None:
    np.save(tmp_path / "big.npy", np.zeros((21, 21)) + np.triu(np.ones((21, 21)), 1))
    with pytest.raises(UserError, match="K <= 20"):
        _run(["solve", str(tmp_path / "big.npy"), "--solver", "exact"])
