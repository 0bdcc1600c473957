"""The loss change an order is predicted to give, in nats, from the S (or the potential f) that chose it.

D3's objective (docs/design/method.md §8) is first order in the influence A[i, j] ≈ I[i→j], the change of batch
j's loss when batch i trains first. Summed over a chunk trained in order π, the loss each batch is trained
at moves by

    C(π) = Σ_{i before j in π} A[i, j]
         = Σ_{i<j} (A[i, j] + A[j, i]) / 2  −  F(π) / 2,      F(π) = Σ_{i before j in π} S[i, j]

since A[i, j] = sym − S[i, j]/2 with S = Aᵀ − A. The symmetric part is the same for every order, so

    ΔC(π vs stream)      = −(F(π) − F(identity)) / 2
    ΔC(π vs mean random) = −F(π) / 2                          (E_σ F(σ) = 0: S is antisymmetric)

Negative is a predicted gain (nats, summed over the chunk's batches; the loss of the batches themselves,
D3's stand-in for the held-out loss: S is estimated on the chunk, not on held-out data). Unlike the
S cost, which the sort of a potential makes 0 by construction, these differ between chunks and runs:
they are as large as the chunk's spread of influence.

For the drift potential alone, S[i, j] = η·(f_j − f_i) (d3ray/influence/potential.py, eq. P3), and

    F(π) = η · Σ_t f_{π_t} · (2t − (K − 1))                   (item at position t: t pairs before, K−1−t after)

so the figures come from the K numbers f in O(K), without building S.
"""

from __future__ import annotations

import numpy as np

__all__ = ["forward_weight", "potential_forward_weight", "predicted_loss_change"]


def forward_weight(S: np.ndarray, order: np.ndarray | list[int]) -> float:
    """F(π) = Σ_{a < b} S[π_a, π_b]: the weight of S that ``order`` puts forward (module docstring).

    Args:
        S: (K, K) antisymmetric advantage.
        order: (K,) permutation, order[t] = item trained at step t.
    """
    S = np.asarray(S, dtype=np.float64)
    P = S[np.ix_(np.asarray(order), np.asarray(order))]  # (K, K) S in training order
    return float(np.triu(P, 1).sum())


def potential_forward_weight(f: np.ndarray, order: np.ndarray | list[int], step_size: float,
                             excluded: np.ndarray | None = None) -> float:
    """F(π) of the potential S[i, j] = η·(f_j − f_i), from f alone: η·Σ_t f_{π_t}·(2t − (K − 1)).

    Args:
        f: (K,) potential.
        order: (K,) permutation.
        step_size: η.
        excluded: (K,) bool, batches whose row and column of S are zero (d3ray/influence/influence.py:
            a non-finite loss or statistic); they are left out of the sum (t and K count the others).
    """
    order = np.asarray(order)
    f = np.asarray(f, dtype=np.float64)[order]
    keep = np.ones(f.shape[0], dtype=bool) if excluded is None else ~np.asarray(excluded, dtype=bool)[order]
    f = f[keep]
    K = f.shape[0]
    return float(step_size * (f * (2.0 * np.arange(K) - (K - 1))).sum())


def predicted_loss_change(forward_chosen: float, forward_stream: float) -> dict[str, float]:
    """The schedule-log fields of an order from F(chosen) and F(stream order) (module docstring), nats.

    Returns:
        ``predicted_loss_change_vs_stream_nats`` and ``predicted_loss_change_vs_random_nats``.
    """
    return {"predicted_loss_change_vs_stream_nats": -(forward_chosen - forward_stream) / 2.0,
            "predicted_loss_change_vs_random_nats": -forward_chosen / 2.0}
