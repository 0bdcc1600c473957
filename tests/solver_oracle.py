"""Test oracle for the compiled solver kernels: the numpy form of eq. 1 and 2 of ``d3ray.solver.problem``.

Slow but obviously right: every formula is a vectorised restatement of the docstring of
``d3ray/solver/problem.py``, and ``reference_cost`` re-scores a whole order from the definition.
The product uses ``d3ray.solver.kernels``; the tests compare the two.
"""

from __future__ import annotations

import numpy as np


def reference_cost(S: np.ndarray, order) -> float:
    """The D3 objective from its definition, in position space: Σ_{a>b} max(0, S[order[a], order[b]])."""
    S = np.asarray(S, dtype=np.float64)
    o = np.asarray(order, dtype=np.int64)
    P = S[np.ix_(o, o)]
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
