"""The subset DP of d3ray.solver.exact against brute force over all permutations."""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest

from d3ray.solver import ExactConfig, ordering_cost, solve, solve_exact


@functools.cache
def all_permutations(K: int) -> np.ndarray:
    """(K!, K) every permutation of range(K)."""
    return np.array(list(itertools.permutations(range(K))), dtype=np.int64).reshape(-1, K)


def brute_force_cost(S: np.ndarray) -> float:
    """Least cost over all K! orders (vectorised; K <= 8)."""
    K = S.shape[0]
    perms = all_permutations(K)  # (K!, K)
    P = S[perms[:, :, None], perms[:, None, :]]  # (K!, K, K) position space
    lower = np.tril(np.ones((K, K), dtype=bool), -1)
    return float(np.where(lower, np.maximum(P, 0.0), 0.0).sum(axis=(1, 2)).min())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_solve_exact_k8_equals_brute_force(seed: int) -> None:
    A = np.random.default_rng(seed).normal(size=(8, 8))
    S = A - A.T
    order, cost = solve_exact(S)
    assert sorted(order.tolist()) == list(range(8))
    assert cost == pytest.approx(ordering_cost(S, order), abs=1e-9)
    assert cost == pytest.approx(brute_force_cost(S), abs=1e-9)


def test_solve_exact_acyclic_tournament_recovers_hidden_order_at_zero_cost() -> None:
    hidden = np.array([3, 0, 4, 1, 2])
    rank = np.empty(5, dtype=int)
    rank[hidden] = np.arange(5)
    S = np.sign(rank[None, :] - rank[:, None]).astype(float)  # S[i, j] = +1 when i precedes j
    order, cost = solve_exact(S)
    assert cost == 0.0
    assert order.tolist() == hidden.tolist()


def test_solve_exact_k21_raises() -> None:
    with pytest.raises(ValueError, match="K <= 20"):
        solve_exact(np.zeros((21, 21)))


def test_exact_config_solve_reports_optimum_in_stats() -> None:
    A = np.random.default_rng(7).normal(size=(6, 6))
    result = solve(A - A.T, ExactConfig())
    assert result.stats["optimum"] == pytest.approx(result.cost)
    assert result.cost == pytest.approx(brute_force_cost(A - A.T), abs=1e-9)
