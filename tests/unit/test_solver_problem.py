"""Objective, input checks and move deltas of d3ray.solver.problem on small hand-made cases."""

from __future__ import annotations

import numpy as np
import pytest

from d3ray.solver.problem import check_order, ordering_cost, swap_delta, validate_advantage
from tests.solver_oracle import apply_insertion, apply_swap, insertion_delta_matrix, insertion_deltas


def _random_advantage(K: int, seed: int) -> np.ndarray:
    A = np.random.default_rng(seed).normal(size=(K, K))
    return A - A.T


def test_ordering_cost_three_items_matches_hand_count() -> None:
    # 0 -> 1 weight 2, 1 -> 2 weight 3, 2 -> 0 weight 1 (a 3-cycle: some edge must be violated)
    S = np.array([[0.0, 2.0, -1.0], [-2.0, 0.0, 3.0], [1.0, -3.0, 0.0]])
    assert ordering_cost(S, [0, 1, 2]) == 1.0  # only 2 -> 0 points backwards
    assert ordering_cost(S, [2, 0, 1]) == 3.0  # 1 -> 2 backwards
    assert ordering_cost(S, [1, 2, 0]) == 2.0  # 0 -> 1 backwards
    assert ordering_cost(S, [2, 1, 0]) == 5.0  # 0 -> 1 and 1 -> 2 backwards


def test_validate_advantage_non_square_raises() -> None:
    with pytest.raises(ValueError, match="square"):
        validate_advantage(np.zeros((2, 3)))


def test_validate_advantage_nan_raises_naming_entry() -> None:
    S = np.zeros((3, 3))
    S[1, 2] = np.nan
    with pytest.raises(ValueError, match=r"non-finite.*S\[1, 2\]"):
        validate_advantage(S)


def test_validate_advantage_symmetric_part_raises_naming_worst_entry() -> None:
    S = _random_advantage(4, 0)
    S[2, 3] += 0.5
    S[0, 1] += 0.1
    with pytest.raises(ValueError, match=r"not antisymmetric: S\[2, 3\]"):
        validate_advantage(S)


def test_validate_advantage_float32_noise_within_tolerance_returns_exact_antisymmetric() -> None:
    S = _random_advantage(6, 1) * 1e4
    noisy = S.astype(np.float32)
    noisy[0, 1] += 1e-3  # below atol * max|S|
    out = validate_advantage(noisy)
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, -out.T)
    assert out is not noisy


def test_check_order_not_a_permutation_raises() -> None:
    with pytest.raises(ValueError, match="permutation"):
        check_order([0, 0, 2], 3)
    with pytest.raises(ValueError, match="permutation"):
        check_order([0, 1], 3)


def test_insertion_deltas_every_move_matches_rescoring() -> None:
    S = validate_advantage(_random_advantage(9, 2))
    order = np.random.default_rng(3).permutation(9)
    base = ordering_cost(S, order)
    D = insertion_delta_matrix(S, order)
    for p in range(9):
        np.testing.assert_allclose(insertion_deltas(S, order, p), D[p], atol=1e-12)
        for q in range(9):
            moved = order.copy()
            apply_insertion(moved, p, q)
            assert ordering_cost(S, moved) - base == pytest.approx(D[p, q], abs=1e-9)


def test_swap_delta_every_pair_matches_rescoring() -> None:
    S = validate_advantage(_random_advantage(8, 4))
    order = np.random.default_rng(5).permutation(8)
    base = ordering_cost(S, order)
    for a in range(8):
        for b in range(8):
            swapped = order.copy()
            apply_swap(swapped, a, b)
            assert ordering_cost(S, swapped) - base == pytest.approx(swap_delta(S, order, a, b), abs=1e-9)


def test_apply_insertion_moves_item_and_shifts_others() -> None:
    order = np.arange(5)
    apply_insertion(order, 1, 3)
    assert order.tolist() == [0, 2, 3, 1, 4]
    apply_insertion(order, 3, 0)
    assert order.tolist() == [1, 0, 2, 3, 4]
