"""Hypothesis properties of the solvers: exact = brute force, heuristics between exact and init."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from d3ray.solver import SolverConfig, ordering_cost, solve_exact, swap_delta
from tests.solver_oracle import apply_insertion, insertion_delta_matrix
from tests.unit.test_solver_exact import brute_force_cost

FAST = {"ils": {"max_iters": 10}, "rsr": {"max_iters": 300}}


@st.composite
def advantages(draw: st.DrawFn, max_k: int = 7) -> np.ndarray:
    """Antisymmetric S with ties and zeros (small integers) or generic (Gaussian) entries."""
    K = draw(st.integers(1, max_k))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    A = rng.integers(-2, 3, size=(K, K)).astype(float) if draw(st.booleans()) else rng.normal(size=(K, K))
    return A - A.T


@settings(max_examples=40, deadline=None)
@given(S=advantages())
def test_solve_exact_equals_brute_force(S: np.ndarray) -> None:
    order, cost = solve_exact(S)
    assert sorted(order.tolist()) == list(range(S.shape[0]))
    assert abs(cost - ordering_cost(S, order)) < 1e-9
    assert abs(cost - brute_force_cost(S)) < 1e-9


@settings(max_examples=25, deadline=None)
@given(S=advantages(), name=st.sampled_from(SolverConfig.known()), data=st.data())
def test_solver_cost_between_exact_and_initial(S: np.ndarray, name: str, data: st.DataObject) -> None:
    K = S.shape[0]
    init = np.array(data.draw(st.permutations(range(K))), dtype=np.int64)
    seed = data.draw(st.integers(0, 1000))
    result = SolverConfig.lookup(name)(**FAST.get(name, {})).build().solve(S, init=init, seed=seed)
    assert sorted(result.order.tolist()) == list(range(K))
    assert result.cost <= ordering_cost(S, init) + 1e-9
    assert result.cost >= brute_force_cost(S) - 1e-9
    again = SolverConfig.lookup(name)(**FAST.get(name, {})).build().solve(S, init=init, seed=seed)
    assert again.order.tolist() == result.order.tolist()


@settings(max_examples=30, deadline=None)
@given(S=advantages(max_k=10), data=st.data())
def test_move_deltas_match_rescoring(S: np.ndarray, data: st.DataObject) -> None:
    K = S.shape[0]
    order = np.array(data.draw(st.permutations(range(K))), dtype=np.int64)
    p, q = data.draw(st.integers(0, K - 1)), data.draw(st.integers(0, K - 1))
    base = ordering_cost(S, order)
    moved = order.copy()
    apply_insertion(moved, p, q)
    assert abs(ordering_cost(S, moved) - base - insertion_delta_matrix(S, order)[p, q]) < 1e-9
    swapped = order.copy()
    swapped[[p, q]] = swapped[[q, p]]
    assert abs(ordering_cost(S, swapped) - base - swap_delta(S, order, p, q)) < 1e-9
