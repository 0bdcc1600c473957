"""The potential short-cut of the solver layer (d3ray/solver/potential.py), on hand-worked 3-item cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from d3ray.solver import solve
from d3ray.solver.ils import IlsConfig
from d3ray.solver.potential import fit_potential, potential_shortcut


def _residual_case() -> np.ndarray:
    # the potential of f = (0, 1, 2) (S[i, j] = f_j − f_i), with the pair (1, 2) pushed the other way by 1.5
    f = np.array([0.0, 1.0, 2.0])
    S = f[None, :] - f[:, None]
    S[1, 2], S[2, 1] = -0.5, 0.5
    return S


def test_fit_potential_residual_case_gives_hand_computed_least_squares_potential():
    # p̂_i = −(row sum)/3: rows 3, −1.5, −1.5
    np.testing.assert_allclose(fit_potential(_residual_case()), [-1.0, 0.5, 0.5], rtol=0, atol=1e-15)


def test_potential_shortcut_residual_case_accepted_only_within_tolerance():
    S, init = _residual_case(), np.arange(3)
    # the sort (0, 1, 2) (tie 1 = 2 kept in the initial order) violates S[2, 1] = 0.5: not certified
    assert potential_shortcut(S, init, tol=0.0) is None
    loose = potential_shortcut(S, init, tol=0.5)
    # ‖R‖_F = √(6 · 0.25) and ‖P̂‖_F = √(4 · 2.25) = 3
    assert loose is not None and not loose.exact and loose.cost == 0.5
    assert loose.order.tolist() == [0, 1, 2]
    assert loose.residual_ratio == pytest.approx(math.sqrt(1.5) / 3, rel=1e-12)


def test_solve_residual_case_searches_without_tolerance_and_short_cuts_with_it():
    S = _residual_case()
    searched = solve(S, IlsConfig(max_iters=20))
    cut = solve(S, IlsConfig(max_iters=20, potential_tol=0.5))

    assert searched.order.tolist() == [0, 2, 1] and searched.cost == 0.0
    assert "shortcut" not in searched.stats
    assert cut.stats["shortcut"] == "potential" and cut.stats["exact"] is False and cut.cost == 0.5


def test_solve_pure_potential_is_certified_by_the_sort():
    f = np.array([0.3, -1.0, 2.0, 0.7])
    result = solve(f[None, :] - f[:, None])
    assert result.order.tolist() == [1, 0, 3, 2] and result.cost == 0.0
    assert result.stats["shortcut"] == "potential" and result.stats["exact"] is True


def test_ils_config_negative_potential_tol_raises():
    with pytest.raises(ValueError, match="potential_tol"):
        IlsConfig(potential_tol=-0.1)
