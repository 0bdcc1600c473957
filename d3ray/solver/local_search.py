"""Improvement by local moves: the paper's Random-Swap Refinement and steepest insertion descent.

RSR (Xu et al. 2026, solver ablation; docs/design/method.md §9): start from Row-Sum, propose
uniformly random position swaps, keep a swap when it lowers the cost (eq. 2 of
:mod:`d3ray.solver.problem`, O(|b − a|) per proposal, never a re-scoring).

:class:`Descent` is the local search of the default solver (:mod:`d3ray.solver.ils`): first-improvement
descent in the insertion neighbourhood (Schiavinotto & Stützle 2004, J. Math. Model. Algorithms 3,
"The linear ordering problem: instances, search space analysis and algorithms", LS_f), each item's
K moves evaluated in O(K) by eq. 1 of :mod:`d3ray.solver.problem`, compiled
(:mod:`d3ray.solver.kernels`). An insertion local optimum is also a local optimum for adjacent swaps.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from d3ray.solver.base import SolverBase, SolverConfig, check_budget
from d3ray.solver.greedy import row_sum_order
from d3ray.solver.problem import ordering_cost, swap_delta

logger = logging.getLogger(__name__)

__all__ = [
    "Descent",
    "RsrConfig",
    "RsrSolver",
    "random_swap_refinement",
]


def _tolerance(S: np.ndarray) -> float:
    """Smallest cost change counted as an improvement: float noise of a K-term sum stays below it."""
    return 1e-12 * max(1.0, S.shape[0]) * float(np.abs(S).max())


def random_swap_refinement(
    S: np.ndarray,
    order: np.ndarray,
    cost: float,
    rng: np.random.Generator,
    max_iters: int,
    deadline: float = float("inf"),
) -> tuple[np.ndarray, float, dict[str, Any]]:
    """RSR: ``max_iters`` random position swaps, each kept if it lowers the cost.

    Args:
        S: (K, K) antisymmetric advantage.
        order: (K,) start permutation (copied).
        cost: its objective.
        rng: source of the proposals.
        max_iters: number of proposals.
        deadline: ``time.perf_counter()`` value after which to stop.

    Returns:
        (order, cost, stats) with stats ``iters``, ``moves``, ``stopped_by``.
    """
    order = order.copy()
    K = order.shape[0]
    tol = _tolerance(S)
    moves = done = 0
    stopped_by = "max_iters"
    block = 1024
    while done < max_iters and K > 1:
        if time.perf_counter() > deadline:
            stopped_by = "time"
            break
        n = min(block, max_iters - done)
        a = rng.integers(0, K, size=n)
        b = (a + rng.integers(1, K, size=n)) % K  # uniform over b != a
        for i in range(n):
            d = swap_delta(S, order, int(a[i]), int(b[i]))
            if d < -tol:
                order[a[i]], order[b[i]] = order[b[i]], order[a[i]]
                cost += d
                moves += 1
        done += n
    return order, cost, {"iters": done, "moves": moves, "stopped_by": stopped_by}


class Descent:
    """Insertion descent on one S (compiled :func:`~d3ray.solver.kernels.descend`), deadline-aware.

    The kernel runs a bounded number of first-improvement sweeps per call (about 0.25 M move
    evaluations, ~1 ms) so that the wall clock is checked between calls at every K.

    Args:
        S: (K, K) antisymmetric advantage.
    """

    def __init__(self, S: np.ndarray) -> None:
        self.S = np.ascontiguousarray(S, dtype=np.float64)
        K = S.shape[0]
        self.tol = _tolerance(S)
        self.sweeps_per_call = max(1, 250_000 // max(1, K * K))
        self.sweeps = 0
        self.moves = 0

    def __call__(self, order: np.ndarray, cost: float, deadline: float = float("inf")) -> tuple[float, bool]:
        """Descend from ``order`` (modified in place) to a local optimum of the insertion neighbourhood.

        Args:
            order: (K,) int64 permutation, modified in place.
            cost: objective of ``order``; the returned cost is this plus the applied moves' deltas.
            deadline: ``time.perf_counter()`` value after which to stop, possibly short of a local optimum.

        Returns:
            (cost, timed_out).
        """
        from d3ray.solver import kernels  # numba: imported by the first descent, not by the config

        while True:
            change, moves, sweeps, done = kernels.descend(self.S, order, self.tol, self.sweeps_per_call)
            cost += change
            self.moves += moves
            self.sweeps += sweeps
            if done:
                return cost, False
            if time.perf_counter() > deadline:
                return cost, True


class RsrSolver(SolverBase):
    """Random-Swap Refinement from Row-Sum (see :func:`random_swap_refinement`)."""

    config: RsrConfig

    def _search(self, S, init, init_cost, seed, deadline) -> tuple[np.ndarray, dict[str, Any]]:
        start = row_sum_order(S, init)
        start_cost = ordering_cost(S, start)
        if init_cost < start_cost:
            start, start_cost = init, init_cost
        rng = np.random.default_rng(seed)
        order, _, stats = random_swap_refinement(S, start, start_cost, rng, self.config.max_iters, deadline)
        return order, {**stats, "start_cost": start_cost}


@SolverConfig.register("rsr")
@dataclass(frozen=True, kw_only=True)
class RsrConfig(SolverConfig):
    """The paper's Random-Swap Refinement, started from Row-Sum (or ``init`` if that is better)."""

    max_iters: int = 10_000
    """Number of random swap proposals."""
    time_budget_s: float | None = None
    """Wall-clock cap in seconds (None: none); when it binds the result depends on machine speed."""

    def __post_init__(self) -> None:
        check_budget("rsr", self.time_budget_s, self.max_iters)

    def build(self) -> RsrSolver:
        return RsrSolver(self)
