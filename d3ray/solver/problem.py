"""The ordering problem of D3: objective, input checks and incremental move deltas.

D3 (Xu et al. 2026, arXiv 2605.31164; docs/design/method.md §8) orders the L batches of a chunk by
minimising the weight of the violated pairs of the directional advantage S (K x K, antisymmetric,
S[i, j] > 0 means "train i before j"):

    cost(σ) = Σ_{i≠j} max(0, S[i, j]) · [σ(j) < σ(i)]

This is the weighted minimum feedback arc set / linear ordering problem (LOP). Everything here is
shared by all solvers, so that no solver ever re-scores a whole order to judge a move. The insertion
moves of eq. 1 run compiled in :mod:`d3ray.solver.kernels` (their numpy twin is the tests' oracle,
``tests/solver_oracle.py``).

Move deltas (Schiavinotto & Stützle 2004, "The linear ordering problem: instances, search space
analysis and algorithms", J. Math. Model. Algorithms 3, insertion neighbourhood). Write
P = S[order][:, order] for the weights in position space. Because S is antisymmetric, moving the item
at position p past the item at position k changes the cost by exactly P[p, k], whichever of the two
directions carried the positive weight. Hence, with cx[p, j] = Σ_{k<j} P[p, k] (an exclusive prefix sum):

    Δ_insert(p → q) = cx[p, q + 1] − cx[p, p]   for q > p
                    = cx[p, q]     − cx[p, p]   for q < p          (eq. 1)

so one cumulative sum over a row gives the deltas of all n moves of one item (O(n)), and one over P
gives the whole n x n insertion neighbourhood (O(n²)). Swapping positions a < b (items x, y, with the
items m strictly between them) costs

    Δ_swap(a, b) = S[x, y] + Σ_m (S[x, m] − S[y, m])                (eq. 2)
"""

from __future__ import annotations

import logging

import numpy as np

logger = logging.getLogger(__name__)

__all__ = [
    "check_order",
    "ordering_cost",
    "swap_delta",
    "validate_advantage",
]


def validate_advantage(S: np.ndarray, atol: float = 1e-6) -> np.ndarray:
    """Check a directional-advantage matrix and return an exactly antisymmetric float64 copy.

    Args:
        S: (K, K) advantage matrix, S[i, j] > 0 meaning "i before j".
        atol: tolerance on |S[i, j] + S[j, i]|, scaled by max(1, max|S|) so that float32 inputs of any
            magnitude pass while a matrix that is not antisymmetric does not.

    Returns:
        (K, K) float64 array (S − Sᵀ) / 2: antisymmetric to the last bit, diagonal exactly zero.

    Raises:
        ValueError: S is not a square 2-D matrix, has a NaN/inf entry, or is not antisymmetric within
            the tolerance; the message names the worst entry.
    """
    S = np.asarray(S)
    if S.ndim != 2 or S.shape[0] != S.shape[1]:
        raise ValueError(f"S must be a square (K, K) matrix, got shape {S.shape}")
    if not (np.issubdtype(S.dtype, np.number) or S.dtype == np.bool_):
        raise ValueError(f"S must be numeric, got dtype {S.dtype}")
    S = S.astype(np.float64, copy=True)
    finite = np.isfinite(S)
    if not finite.all():
        i, j = np.argwhere(~finite)[0]
        raise ValueError(f"S has {int((~finite).sum())} non-finite entries, first S[{i}, {j}] = {S[i, j]}")
    if S.size == 0:
        return S
    scale = max(1.0, float(np.abs(S).max()))
    asym = np.abs(S + S.T)
    worst = np.unravel_index(int(np.argmax(asym)), asym.shape)
    if asym[worst] > atol * scale:
        i, j = (int(v) for v in worst)
        raise ValueError(
            f"S is not antisymmetric: S[{i}, {j}] = {S[i, j]:.6g} but S[{j}, {i}] = {S[j, i]:.6g} "
            f"(|sum| {asym[worst]:.3g} > tolerance {atol * scale:.3g}); build S as Aᵀ − A"
        )
    return (S - S.T) * 0.5


def check_order(order: np.ndarray | list[int], K: int) -> np.ndarray:
    """Return ``order`` as an int64 array after checking it is a permutation of range(K).

    Raises:
        ValueError: wrong length, or not each of 0..K-1 exactly once.
    """
    arr = np.asarray(order)
    if arr.ndim != 1 or arr.shape[0] != K:
        raise ValueError(f"order must be a permutation of range({K}), got shape {arr.shape}")
    if K and not np.issubdtype(arr.dtype, np.integer):
        if not np.all(np.mod(arr, 1) == 0):
            raise ValueError(f"order must hold integers, got dtype {arr.dtype}")
    arr = arr.astype(np.int64, copy=True)
    if K and (arr.min() < 0 or arr.max() >= K or np.unique(arr).shape[0] != K):
        raise ValueError(f"order is not a permutation of range({K}): {arr.tolist()[:20]}")
    return arr


def ordering_cost(S: np.ndarray, order: np.ndarray | list[int]) -> float:
    """Weight of the violated pairs: Σ over pairs with j placed before i of max(0, S[i, j]).

    Args:
        S: (K, K) antisymmetric advantage (as returned by :func:`validate_advantage`; not re-checked).
        order: (K,) permutation, order[t] = item trained at step t.

    Returns:
        The D3 objective (docs/design/method.md §8); 0 means every positive edge points forward.
    """
    from d3ray.solver import kernels  # numba compiles on first use; importing this module stays cheap

    S = np.ascontiguousarray(S, dtype=np.float64)
    return float(kernels.order_cost(S, np.ascontiguousarray(order, dtype=np.int64)))


def swap_delta(S: np.ndarray, order: np.ndarray, a: int, b: int) -> float:
    """Cost change of swapping the items at positions a and b (eq. 2), O(|b − a|)."""
    if a == b:
        return 0.0
    if a > b:
        a, b = b, a
    x, y = order[a], order[b]
    mid = order[a + 1 : b]
    return float(S[x, y] + (S[x, mid] - S[y, mid]).sum())
