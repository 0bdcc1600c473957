"""Exact ordering by dynamic programming over subsets, for small K (K <= 20).

Used to measure the gap of the heuristics (the `exact` solver of the benchmark at L = 20) and as the
reference of the property tests. Held-Karp style DP (Held & Karp 1962, applied to the linear ordering
problem e.g. in Martí & Reinelt, "The Linear Ordering Problem", 2011, section 2.3): let f[M] be the
least cost of ordering the item set M as a prefix. Appending x after all of M violates every pair
(x, j), j ∈ M, with S[x, j] > 0, so with W = max(0, S)

    f[M] = min_{x ∈ M} f[M \\ {x}] + Σ_{j ∈ M} W[x, j]              (W[x, x] = 0)

evaluated layer by layer over |M| (each layer vectorised in numpy), in O(2^K · K²) time and O(2^K)
memory: about 1 s and 10 MB at K = 20.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from d3ray.solver.base import SolverBase, SolverConfig

logger = logging.getLogger(__name__)

MAX_EXACT_K = 20

__all__ = ["MAX_EXACT_K", "ExactConfig", "ExactSolver", "solve_exact"]


def solve_exact(S: np.ndarray) -> tuple[np.ndarray, float]:
    """Optimal order of a small advantage matrix.

    Args:
        S: (K, K) antisymmetric advantage (validated by the caller, or use ``solve(S, ExactConfig())``).

    Returns:
        (order, cost): order (K,) int64, an optimal permutation (ties broken towards the smallest item
        last, deterministic); cost its objective value.

    Raises:
        ValueError: K > 20 (2^K states would not fit) or S is not square.
    """
    S = np.asarray(S, dtype=np.float64)
    if S.ndim != 2 or S.shape[0] != S.shape[1]:
        raise ValueError(f"S must be a square (K, K) matrix, got shape {S.shape}")
    K = S.shape[0]
    if K > MAX_EXACT_K:
        raise ValueError(
            f"exact solver handles K <= {MAX_EXACT_K} (2^K subsets), got K = {K}; use a heuristic (ils)"
        )
    if K <= 1:
        return np.arange(K, dtype=np.int64), 0.0
    W = np.maximum(S, 0.0)
    np.fill_diagonal(W, 0.0)

    n_masks = 1 << K
    masks = np.arange(n_masks, dtype=np.int64)
    popcount = np.bitwise_count(masks)
    by_size = np.argsort(popcount, kind="stable")
    bounds = np.searchsorted(popcount[by_size], np.arange(K + 2))
    f = np.full(n_masks, np.inf)
    f[0] = 0.0
    last = np.zeros(n_masks, dtype=np.int8)  # the item appended last in the best order of M
    shifts = np.arange(K, dtype=np.int64)
    for size in range(1, K + 1):
        M = by_size[bounds[size] : bounds[size + 1]]  # (m,) all masks with |M| = size
        bits = ((M[:, None] >> shifts) & 1).astype(np.float64)  # (m, K)
        added = bits @ W.T  # (m, K): added[M, x] = Σ_{j ∈ M} W[x, j]
        best = np.full(M.shape[0], np.inf)
        arg = np.zeros(M.shape[0], dtype=np.int8)
        for x in range(K):
            has = bits[:, x] > 0
            cand = np.where(has, f[M ^ (1 << x)] + added[:, x], np.inf)
            better = cand < best
            best = np.where(better, cand, best)
            arg = np.where(better, np.int8(x), arg)
        f[M] = best
        last[M] = arg

    order = np.empty(K, dtype=np.int64)
    mask = n_masks - 1
    for t in range(K - 1, -1, -1):
        x = int(last[mask])
        order[t] = x
        mask ^= 1 << x
    return order, float(f[n_masks - 1])


class ExactSolver(SolverBase):
    """Optimal order by subset DP (see :func:`solve_exact`); ``init`` and ``seed`` are not used."""

    shortcut_potential = False  # the reference: always the DP (which refuses K > 20)

    def _search(self, S, init, init_cost, seed, deadline) -> tuple[np.ndarray, dict[str, Any]]:
        order, cost = solve_exact(S)
        return order, {"optimum": cost}


@SolverConfig.register("exact")
@dataclass(frozen=True, kw_only=True)
class ExactConfig(SolverConfig):
    """Exact DP over subsets; refuses K > 20 with a ValueError. No settings."""

    def build(self) -> ExactSolver:
        return ExactSolver(self)
