"""The compiled kernels of d3ray.solver.kernels against the numpy oracle of tests/solver_oracle.py."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from d3ray.solver import kernels
from d3ray.solver.problem import ordering_cost
from tests.property.test_solver_properties import advantages
from tests.solver_oracle import insertion_delta_matrix, insertion_deltas, reference_cost


def _permutation(K: int, data: st.DataObject) -> np.ndarray:
    return np.asarray(data.draw(st.permutations(range(K))), dtype=np.int64)


@settings(max_examples=60, deadline=None)
@given(S=advantages(max_k=9), data=st.data())
def test_order_cost_and_best_insertion_match_numpy(S: np.ndarray, data: st.DataObject) -> None:
    order = _permutation(S.shape[0], data)
    assert np.isclose(kernels.order_cost(S, order), reference_cost(S, order), rtol=1e-12, atol=1e-12)
    for p in range(S.shape[0]):
        q, delta = kernels.best_insertion(S, order, p)
        deltas = insertion_deltas(S, order, p)
        assert np.isclose(delta, min(0.0, deltas.min()), atol=1e-12)
        assert np.isclose(deltas[q], delta, atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(S=advantages(max_k=12), data=st.data())
def test_descend_reaches_insertion_local_optimum_with_exact_change(S: np.ndarray, data: st.DataObject) -> None:
    order = _permutation(S.shape[0], data)
    before = ordering_cost(S, order)
    change, moves, sweeps, done = kernels.descend(S, order, 1e-12, 10_000)
    assert done and sweeps >= 1
    assert sorted(order.tolist()) == list(range(S.shape[0]))
    assert np.isclose(ordering_cost(S, order), before + change, atol=1e-9)
    assert (moves == 0) == (change == 0.0)
    assert insertion_delta_matrix(S, order).min() >= -1e-9  # no improving insertion move is left


@settings(max_examples=60, deadline=None)
@given(S=advantages(max_k=12), data=st.data())
def test_kick_returns_its_exact_cost_change(S: np.ndarray, data: st.DataObject) -> None:
    K = S.shape[0]
    order = _permutation(K, data)
    kernels.seed(data.draw(st.integers(0, 2**31 - 1)))
    before = ordering_cost(S, order)
    change = kernels.kick(S, order, data.draw(st.integers(1, 10)), max(1, K - 1))
    assert sorted(order.tolist()) == list(range(K))
    assert np.isclose(ordering_cost(S, order), before + change, atol=1e-9)


@settings(max_examples=60, deadline=None)
@given(K=st.integers(2, 30), seed=st.integers(0, 2**31 - 1), keep=st.floats(0.05, 0.95))
def test_crossover_keeps_some_positions_of_a_and_the_rest_in_b_order(K: int, seed: int, keep: float) -> None:
    rng = np.random.default_rng(seed)
    a, b = rng.permutation(K), rng.permutation(K)
    kernels.seed(seed)
    child = kernels.crossover(a, b, keep)
    assert sorted(child.tolist()) == list(range(K))
    from_b = child != a  # positions refilled from b (a kept position always agrees with a)
    refilled = child[from_b].tolist()
    assert refilled == [x for x in b.tolist() if x in set(refilled)]  # b's relative order


def test_seeded_kernels_repeat_exactly() -> None:
    S = np.random.default_rng(3).normal(size=(20, 20))
    S = S - S.T
    runs = []
    for _ in range(2):
        kernels.seed(11)
        order = kernels.permutation(20)
        kernels.kick(S, order, 5, 4)
        runs.append(kernels.crossover(order, order[::-1].copy(), 0.5))
    assert np.array_equal(runs[0], runs[1])
