"""The ordering problem of D3: objective, input checks and incremental move deltas.

D3 (Xu et al. 2026, arXiv 2605.31164; ARCHITECTURE.md section 1) orders the L batches of a chunk by
minimising the weight of the violated pairs of the directional advantage S (K x K, antisymmetric,
S[i, j] > 0 means "train i before j"):

    cost(σ) = Σ_{i≠j} max(0, S[i, j]) · [σ(j) < σ(i)]

This is the weighted minimum feedback arc set / linear ordering problem (LOP). Everything here is
pure numpy and shared by all solvers, so that no solver ever re-scores a whole order to judge a move.

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
    "apply_insertion",
    "apply_swap",
    "check_order",
    "insertion_delta_matrix",
    "insertion_deltas",
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
        The D3 objective (ARCHITECTURE.md section 1); 0 means every positive edge points forward.
    """
    S = np.asarray(S, dtype=np.float64)
    o = np.asarray(order, dtype=np.int64)
    P = S[np.ix_(o, o)]  # (K, K) in position space: P[a, b] = S[order[a], order[b]]
    # Row a, column b < a: item at a comes after item at b; violated when S[order[a], order[b]] > 0.
    return float(np.maximum(np.tril(P, -1), 0.0).sum())


def insertion_deltas(S: np.ndarray, order: np.ndarray, p: int) -> np.ndarray:
    """Cost change of moving the item at position p to each position q (eq. 1), O(K).

    Args:
        S: (K, K) antisymmetric advantage.
        order: (K,) current permutation.
        p: position of the item to move.

    Returns:
        (K,) float64, entry q = cost(after move p → q) − cost(order); entry p is 0.
    """
    row = S[order[p], order]  # (K,) P[p, :]
    cx = np.empty(row.shape[0] + 1)
    cx[0] = 0.0
    np.cumsum(row, out=cx[1:])
    out = cx[:-1] - cx[p]  # q < p (and q == p gives 0)
    out[p + 1 :] = cx[p + 2 :] - cx[p]  # q > p
    return out


def insertion_delta_matrix(S: np.ndarray, order: np.ndarray) -> np.ndarray:
    """The whole insertion neighbourhood (eq. 1): D[p, q] = Δ(move position p to position q), O(K²).

    Args:
        S: (K, K) antisymmetric advantage.
        order: (K,) current permutation.

    Returns:
        (K, K) float64; the diagonal is 0.
    """
    K = order.shape[0]
    P = S[np.ix_(order, order)]  # (K, K)
    cx = np.zeros((K, K + 1))
    np.cumsum(P, axis=1, out=cx[:, 1:])
    upper = np.triu(np.ones((K, K), dtype=bool), 1)  # q > p
    own = cx[np.arange(K), np.arange(K)]  # (K,) cx[p, p]
    return np.where(upper, cx[:, 1:], cx[:, :-1]) - own[:, None]


def swap_delta(S: np.ndarray, order: np.ndarray, a: int, b: int) -> float:
    """Cost change of swapping the items at positions a and b (eq. 2), O(|b − a|)."""
    if a == b:
        return 0.0
    if a > b:
        a, b = b, a
    x, y = order[a], order[b]
    mid = order[a + 1 : b]
    return float(S[x, y] + (S[x, mid] - S[y, mid]).sum())


def apply_insertion(order: np.ndarray, p: int, q: int) -> None:
    """Move the item at position p to position q in place, shifting the items between by one."""
    x = order[p]
    if q > p:
        order[p:q] = order[p + 1 : q + 1]
    elif q < p:
        order[q + 1 : p + 1] = order[q:p].copy()
    order[q] = x


def apply_swap(order: np.ndarray, a: int, b: int) -> None:
    """Swap the items at positions a and b in place."""
    order[a], order[b] = order[b], order[a]
