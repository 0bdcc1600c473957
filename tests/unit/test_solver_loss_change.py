"""The predicted loss change of an order (d3ray/solver/loss_change.py) against the direct sum over pairs
of A, on a hand-written A, every permutation of it, and the potential's O(K) form."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from d3ray.solver.loss_change import forward_weight, potential_forward_weight, predicted_loss_change

# A[i, j]: the change of batch j's loss when batch i trains first (nats)
A = np.array([[0.0, -0.3, 0.1],
              [-0.1, 0.0, -0.4],
              [0.2, 0.05, 0.0]])
S = A.T - A


def trajectory_loss(order) -> float:
    """C(π) = Σ_{i before j} A[i, j], summed directly."""
    return sum(A[order[a], order[b]] for a in range(len(order)) for b in range(a + 1, len(order)))


def test_predicted_loss_change_is_the_pairwise_sum_of_a_against_stream_and_the_mean_permutation():
    perms = list(itertools.permutations(range(3)))
    mean_random = np.mean([trajectory_loss(p) for p in perms])
    for perm in perms:
        got = predicted_loss_change(forward_weight(S, perm), forward_weight(S, [0, 1, 2]))
        assert got["predicted_loss_change_vs_stream_nats"] == pytest.approx(trajectory_loss(perm) - trajectory_loss((0, 1, 2)))
        assert got["predicted_loss_change_vs_random_nats"] == pytest.approx(trajectory_loss(perm) - mean_random)


def test_forward_weight_worked_by_hand():
    # order (2, 0, 1): pairs (2,0), (2,1), (0,1): S[2,0] + S[2,1] + S[0,1] = (0.1−0.2) + (−0.4−0.05) + (−0.1+0.3)
    assert forward_weight(S, [2, 0, 1]) == pytest.approx(-0.1 - 0.45 + 0.2)


def test_potential_forward_weight_equals_the_sum_over_the_potentials_s():
    f, eta = np.array([0.5, -1.0, 2.0, 0.25]), 0.1
    S_pot = eta * (f[None, :] - f[:, None])
    for perm in itertools.permutations(range(4)):
        assert potential_forward_weight(f, perm, eta) == pytest.approx(forward_weight(S_pot, perm))
    # the ascending sort puts every positive weight forward: the largest F, so the most negative change
    best = potential_forward_weight(f, np.argsort(f), eta)
    assert best == pytest.approx(eta * sum(abs(a - b) for a, b in itertools.combinations(f, 2)))
    assert predicted_loss_change(best, 0.0)["predicted_loss_change_vs_random_nats"] == pytest.approx(-best / 2)
