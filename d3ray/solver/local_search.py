"""Improvement by local moves: the paper's Random-Swap Refinement and steepest insertion descent.

RSR (Xu et al. 2026, solver ablation; ARCHITECTURE.md section 1): start from Row-Sum, propose
uniformly random position swaps, keep a swap when it lowers the cost (eq. 2 of
:mod:`d3ray.solver.problem`, O(|b − a|) per proposal, never a re-scoring).

:class:`InsertionDescent` is the local search of the default solver (:mod:`d3ray.solver.ils`): steepest
descent in the insertion neighbourhood (Schiavinotto & Stützle 2004, J. Math. Model. Algorithms 3,
"The linear ordering problem: instances, search space analysis and algorithms"), with the whole
neighbourhood evaluated by one vectorised O(K²) numpy pass (eq. 1 of :mod:`d3ray.solver.problem`).
An insertion local optimum is also a local optimum for adjacent swaps.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from d3ray.solver.base import SolverBase, SolverConfig, check_budget
from d3ray.solver.greedy import row_sum_order
from d3ray.solver.problem import apply_insertion, insertion_deltas, ordering_cost, swap_delta

logger = logging.getLogger(__name__)

# From this K on, single-item evaluations (O(K) numpy work each) between the vectorised O(K²) passes
# pay: measured, a pass costs ~3 sweeps of all K items at K = 1000, but ~5 item evaluations at K = 60.
SWEEP_MIN_K = 256

__all__ = [
    "InsertionDescent",
    "RsrConfig",
    "RsrSolver",
    "insertion_local_search",
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


class InsertionDescent:
    """Steepest-descent in the insertion neighbourhood of one S, with its per-K buffers built once.

    Each pass evaluates all K² insertion moves at once (eq. 1) and applies, best first, every
    improving move whose position range [min(p, q), max(p, q)] is disjoint from those of the moves
    already applied in the pass: such moves commute and leave each other's deltas exact, so one O(K²)
    pass can apply many moves. From K = ``SWEEP_MIN_K`` on, the descent also runs first-improvement
    sweeps (each item's best move, O(K) numpy work per item; Schiavinotto & Stützle's LS_f) before and
    between passes, and re-evaluates the items whose move overlapped an applied one; the passes then
    mostly certify local optimality (a descent from Row-Sum at K = 1000 takes ~3 passes, not ~50).

    Args:
        S: (K, K) antisymmetric advantage.
    """

    def __init__(self, S: np.ndarray) -> None:
        K = S.shape[0]
        self.S = S
        self.K = K
        self.tol = _tolerance(S)
        self.lower = np.tril(np.ones((K, K)), -1)  # (K, K) 1.0 where q < p
        self.diag = np.arange(K)
        # cost = (ΣW − forward) / 2 because S = W − Wᵀ with W = max(0, S).
        self.half_total = 0.5 * float(np.maximum(S, 0.0).sum())
        self.passes = 0

    def __call__(
        self, order: np.ndarray, deadline: float = float("inf"), cost: float | None = None
    ) -> tuple[np.ndarray, float, int, bool]:
        """Descend from ``order`` (modified in place) to a local optimum.

        Args:
            order: (K,) start permutation, modified in place.
            deadline: ``time.perf_counter()`` value after which to stop, possibly short of a local optimum.
            cost: objective of ``order`` if known (saves an O(K²) scoring when the deadline has passed).

        Returns:
            (order, cost, moves applied, timed_out); ``cost`` is exact as of the last pass plus the
            deltas of the moves applied since.
        """
        S, K, diag, tol = self.S, self.K, self.diag, self.tol
        moves = 0
        if K >= SWEEP_MIN_K:  # far from a local optimum at large K: cheap item sweeps first
            cost = ordering_cost(S, order) if cost is None else cost
            moves, gain = self._sweeps(order, deadline)
            cost += gain
        while True:
            if time.perf_counter() > deadline:
                return order, ordering_cost(S, order) if cost is None else cost, moves, True
            self.passes += 1
            P = S[order][:, order]  # (K, K) position space: P[p, k] = S[order[p], order[k]]
            C = np.cumsum(P, axis=1)  # (K, K) C[p, q] = Σ_{k<=q} P[p, k]
            own = C[diag, diag]  # (K,) = Σ_{k<p} P[p, k] since P[p, p] = 0
            # eq. 1: D[p, q] = C[p, q] − C[p, p] for q > p and C[p, q − 1] − C[p, p] for q < p.
            D = C - own[:, None]
            D -= P * self.lower
            qbest = D.argmin(axis=1)
            dbest = D[diag, qbest]
            cand = np.flatnonzero(dbest < -tol)
            if cand.size == 0 or cost is None:
                # forward weight Σ_{p<k} P[p, k] = Σ_p (C[p, K-1] − C[p, p]); cost = (ΣW − forward) / 2
                cost = self.half_total - 0.5 * float(C[:, -1].sum() - own.sum())
                if cand.size == 0:
                    return order, cost, moves, False
            if cand.size == 1:
                apply_insertion(order, int(cand[0]), int(qbest[cand[0]]))
                cost += float(dbest[cand[0]])
                moves += 1
                continue
            cand = cand[np.argsort(dbest[cand], kind="stable")]
            taken: list[tuple[int, int]] = []  # position ranges of the moves applied in this pass
            stale = []  # items whose best move overlaps an applied one: re-evaluate them alone
            items = order[cand].tolist()  # before any move of this pass
            for x, p, q, d in zip(
                items, cand.tolist(), qbest[cand].tolist(), dbest[cand].tolist(), strict=True
            ):
                lo, hi = (p, q) if p < q else (q, p)
                if all(hi < a or lo > b for a, b in taken):
                    taken.append((lo, hi))
                    apply_insertion(order, p, q)
                    cost += d
                    moves += 1
                else:
                    stale.append(x)
            if K >= SWEEP_MIN_K:
                # O(K) numpy work per item instead of a new O(K²) pass: cheaper at large K. Below
                # SWEEP_MIN_K the per-call overhead dominates and another pass is cheaper.
                m, gain = self._improve_items(order, stale, deadline)
                moves, cost = moves + m, cost + gain
                m, gain = self._sweeps(order, deadline)
                moves, cost = moves + m, cost + gain

    def _sweeps(self, order: np.ndarray, deadline: float) -> tuple[int, float]:
        """First-improvement sweeps over all items while a sweep still moves >= 2% of them."""
        moves, change = 0, 0.0
        while time.perf_counter() <= deadline:
            m, gain = self._improve_items(order, order.tolist(), deadline)
            moves, change = moves + m, change + gain
            if m * 50 < self.K:
                break
        return moves, change

    def _improve_items(self, order: np.ndarray, items: list[int], deadline: float) -> tuple[int, float]:
        """Give each item in turn its best insertion move if that improves (O(K) each).

        Returns:
            (moves applied, their total cost change).
        """
        moves, change = 0, 0.0
        for x in items:
            if time.perf_counter() > deadline:
                break
            p = int(np.flatnonzero(order == x)[0])
            d = insertion_deltas(self.S, order, p)
            q = int(d.argmin())
            if d[q] < -self.tol:
                apply_insertion(order, p, q)
                moves += 1
                change += float(d[q])
        return moves, change


def insertion_local_search(
    S: np.ndarray, order: np.ndarray, deadline: float = float("inf")
) -> tuple[np.ndarray, float, int, bool]:
    """Descend to a local optimum of the insertion neighbourhood (one-off :class:`InsertionDescent`).

    Args:
        S: (K, K) antisymmetric advantage.
        order: (K,) permutation, modified in place.
        deadline: ``time.perf_counter()`` value after which to stop (the order may then not be optimal).

    Returns:
        (order, cost, moves applied, timed_out).
    """
    return InsertionDescent(S)(order, deadline)


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
