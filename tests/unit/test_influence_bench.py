"""The fidelity metrics of ``d3ray bench influence``: Spearman and normalised order regret."""

from __future__ import annotations

import numpy as np
import pytest

from d3ray.bench.influence import _fidelity
from d3ray.solver.exact import solve_exact
from d3ray.solver.problem import ordering_cost


def _advantage(seed: int, L: int = 6) -> np.ndarray:
    A = np.random.default_rng(seed).normal(size=(L, L))
    return A.T - A


def test_fidelity_reference_against_itself_is_perfect():
    S = _advantage(0)

    rho, regret = _fidelity(S, S)

    assert rho == pytest.approx(1.0)
    assert regret == pytest.approx(0.0, abs=1e-12)


def test_fidelity_reversed_preferences_give_regret_two():
    # The optimum of −S is the reverse of S's optimum, which violates every pair the optimum keeps:
    # cost = total − best, so (total − 2·best) / (total/2 − best) = 2.
    S = _advantage(1)

    rho, regret = _fidelity(-S, S)

    assert rho == pytest.approx(-1.0)
    assert regret == pytest.approx(2.0)


def test_fidelity_all_zero_estimate_keeps_initial_order_and_has_no_spearman():
    S = _advantage(2)

    rho, regret = _fidelity(np.zeros_like(S), S)

    best = solve_exact(S)[1]
    expected = (ordering_cost(S, np.arange(6)) - best) / (0.5 * np.maximum(S, 0).sum() - best)
    assert rho is None
    assert regret == pytest.approx(expected)
