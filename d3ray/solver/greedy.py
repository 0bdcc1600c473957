"""Constructive orderings of the D3 paper's solver ablation: Row-Sum and Greedy Insertion.

Both are one-pass heuristics (Xu et al. 2026, solver ablation; docs/design/method.md §9):

- Row-Sum sorts items by their net advantage r_i = Σ_j S[i, j] (descending): the Borda count of
  the tournament S, optimal when S has rank-2 structure S[i, j] = a_i − a_j.
- Greedy Insertion inserts the items one at a time, each at the position of the partial order where it
  violates the least weight: O(K²) in total, O(t) numpy work for the t-th item.

They also serve as the starting points of RSR and ILS (:mod:`d3ray.solver.local_search`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from d3ray.solver.base import SolverBase, SolverConfig

logger = logging.getLogger(__name__)

__all__ = [
    "GreedyInsertionConfig",
    "GreedyInsertionSolver",
    "RowSumConfig",
    "RowSumSolver",
    "greedy_insertion_order",
    "row_sum_order",
]


def row_sum_order(S: np.ndarray, init: np.ndarray | None = None) -> np.ndarray:
    """Items by descending row sum of S; ties keep their order in ``init`` (default the identity).

    Args:
        S: (K, K) antisymmetric advantage.
        init: (K,) permutation used to break ties.

    Returns:
        (K,) int64 permutation.
    """
    K = S.shape[0]
    base = np.arange(K, dtype=np.int64) if init is None else np.asarray(init, dtype=np.int64)
    r = S.sum(axis=1)[base]  # (K,) in init order
    return base[np.argsort(-r, kind="stable")]


def greedy_insertion_order(S: np.ndarray, sequence: np.ndarray) -> np.ndarray:
    """Insert the items of ``sequence`` one by one at their cheapest position.

    Inserting x at position q of the partial order o (length t) violates
    Σ_{k<q} W[x, o_k] + Σ_{k>=q} W[o_k, x] with W = max(0, S); ties go to the earliest position.

    Args:
        S: (K, K) antisymmetric advantage.
        sequence: (K,) permutation, the insertion sequence.

    Returns:
        (K,) int64 permutation.
    """
    W = np.maximum(S, 0.0)
    K = sequence.shape[0]
    order = np.empty(K, dtype=np.int64)
    for t, x in enumerate(sequence):
        o = order[:t]
        before = np.zeros(t + 1)  # before[q] = Σ_{k<q} W[x, o_k]: x placed after them
        np.cumsum(W[x, o], out=before[1:])
        after = np.zeros(t + 1)  # after[q] = Σ_{k>=q} W[o_k, x]: x placed before them
        np.cumsum(W[o[::-1], x], out=after[1:])
        q = int(np.argmin(before + after[::-1]))
        order[q + 1 : t + 1] = order[q:t].copy()
        order[q] = x
    return order


class RowSumSolver(SolverBase):
    """Row-Sum (see :func:`row_sum_order`)."""

    def _search(self, S, init, init_cost, seed, deadline) -> tuple[np.ndarray, dict[str, Any]]:
        return row_sum_order(S, init), {}


class GreedyInsertionSolver(SolverBase):
    """Greedy Insertion (see :func:`greedy_insertion_order`)."""

    config: GreedyInsertionConfig

    def _search(self, S, init, init_cost, seed, deadline) -> tuple[np.ndarray, dict[str, Any]]:
        sequence = init if self.config.sequence == "initial" else row_sum_order(S, init)
        return greedy_insertion_order(S, sequence), {}


@SolverConfig.register("row_sum")
@dataclass(frozen=True, kw_only=True)
class RowSumConfig(SolverConfig):
    """Row-Sum: descending row sums of S, one O(K²) pass. No settings."""

    def build(self) -> RowSumSolver:
        return RowSumSolver(self)


@SolverConfig.register("greedy_insertion")
@dataclass(frozen=True, kw_only=True)
class GreedyInsertionConfig(SolverConfig):
    """Greedy Insertion: each item at its cheapest position in the partial order."""

    sequence: Literal["initial", "row_sum"] = "initial"
    """Insertion sequence: the initial order (the paper's ablation) or descending row sums."""

    def __post_init__(self) -> None:
        if self.sequence not in ("initial", "row_sum"):
            raise ValueError(
                f"greedy_insertion.sequence must be 'initial' or 'row_sum', got {self.sequence!r}"
            )

    def build(self) -> GreedyInsertionSolver:
        return GreedyInsertionSolver(self)
