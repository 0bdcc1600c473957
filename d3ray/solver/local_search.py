"""Improvement solvers: the paper's Random-Swap Refinement (RSR) and an iterated insertion local search.

RSR (Xu et al. 2026, solver ablation): start from Row-Sum, propose uniformly random position swaps, keep
a swap when it lowers the cost (eq. 2 of :mod:`d3ray.solver.problem`, O(|b − a|) per proposal).

ILS, the default solver, is iterated local search in the insertion neighbourhood, the method
Schiavinotto & Stützle (2004, J. Math. Model. Algorithms 3, "The linear ordering problem: instances,
search space analysis and algorithms") found best among single-solution LOP methods (their memetic
algorithm adds a population; Martí & Reinelt 2011, ch. 2, survey both):

1. local search: evaluate the whole insertion neighbourhood of the current order in one vectorised
   O(K²) numpy pass (eq. 1: a cumulative sum over each row of the permuted S), apply the best move, then
   re-check (O(K) each) and apply the other items whose best move was improving; repeat until no
   insertion move improves (a local optimum of the insertion neighbourhood, which contains the swap one);
2. perturbation: a few random insertion moves of short range from the current local optimum;
3. acceptance: keep the new local optimum if it is not worse (sideways moves let the walk cross
   plateaus); after ``restart_after`` iterations without a new best, restart from the best order with a
   stronger kick.

Stopping: ``max_iters`` perturbation rounds, ``patience`` rounds without a new best, or the wall-clock
``time_budget_s``, whichever comes first. Only the last one makes the result depend on machine speed.
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

__all__ = [
    "IlsConfig",
    "IlsSolver",
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


def insertion_local_search(
    S: np.ndarray, order: np.ndarray, cost: float, deadline: float = float("inf")
) -> tuple[np.ndarray, float, int, bool]:
    """Descend to a local optimum of the insertion neighbourhood (in place on ``order``).

    Each pass evaluates all K² insertion moves at once (eq. 1), applies the best, then re-evaluates
    each other item that had an improving move (O(K) each, best position first-come) and applies its
    best move if it still improves.

    Args:
        S: (K, K) antisymmetric advantage.
        order: (K,) permutation, modified in place.
        cost: its objective, updated by the move deltas.
        deadline: ``time.perf_counter()`` value after which to stop (the order may then not be optimal).

    Returns:
        (order, cost, moves applied, timed_out).
    """
    K = order.shape[0]
    tol = _tolerance(S)
    upper = np.triu(np.ones((K, K), dtype=bool), 1)  # q > p
    diag = np.arange(K)
    cx = np.zeros((K, K + 1))
    moves = 0
    while True:
        if time.perf_counter() > deadline:
            return order, cost, moves, True
        P = S[order][:, order]  # (K, K) position space
        np.cumsum(P, axis=1, out=cx[:, 1:])
        D = np.where(upper, cx[:, 1:], cx[:, :-1])  # (K, K) eq. 1 before subtracting cx[p, p]
        D -= cx[diag, diag][:, None]
        qbest = D.argmin(axis=1)
        dbest = D[diag, qbest]
        cand = np.flatnonzero(dbest < -tol)
        if cand.size == 0:
            return order, cost, moves, False
        cand = cand[np.argsort(dbest[cand], kind="stable")]
        items = order[cand[1:]]
        p0 = int(cand[0])
        apply_insertion(order, p0, int(qbest[p0]))
        cost += float(dbest[p0])
        moves += 1
        for x in items:
            p = int(np.flatnonzero(order == x)[0])
            d = insertion_deltas(S, order, p)
            q = int(d.argmin())
            if d[q] < -tol:
                apply_insertion(order, p, q)
                cost += float(d[q])
                moves += 1


def _perturb(
    S: np.ndarray, order: np.ndarray, cost: float, rng: np.random.Generator, moves: int, reach: int
) -> float:
    """Apply ``moves`` random insertion moves of range <= ``reach`` in place; return the new cost."""
    K = order.shape[0]
    for _ in range(moves):
        p = int(rng.integers(K))
        lo, hi = max(0, p - reach), min(K - 1, p + reach)
        q = int(rng.integers(lo, hi))
        q += q >= p  # uniform over [lo, hi] \ {p}
        cost += float(insertion_deltas(S, order, p)[q])
        apply_insertion(order, p, q)
    return cost


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


class IlsSolver(SolverBase):
    """Iterated insertion local search (see the module docstring)."""

    config: IlsConfig

    def _search(self, S, init, init_cost, seed, deadline) -> tuple[np.ndarray, dict[str, Any]]:
        cfg = self.config
        K = S.shape[0]
        rng = np.random.default_rng(seed)
        tol = _tolerance(S)
        start = row_sum_order(S, init)
        start_cost = ordering_cost(S, start)
        if init_cost < start_cost:
            start, start_cost = init.copy(), init_cost
        cur, cur_cost, moves, timed_out = insertion_local_search(S, start, start_cost, deadline)
        best, best_cost = cur.copy(), cur_cost
        reach = max(1, min(K - 1, cfg.perturb_reach))
        iters = since_best = since_restart = restarts = 0
        stopped_by = "time" if timed_out else "max_iters"
        max_iters = cfg.max_iters if cfg.max_iters is not None else np.iinfo(np.int64).max
        while not timed_out and K > 2:
            if iters >= max_iters:
                break
            if cfg.patience is not None and since_best >= cfg.patience:
                stopped_by = "patience"
                break
            if time.perf_counter() > deadline:
                stopped_by = "time"
                break
            iters += 1
            if since_restart >= cfg.restart_after:
                cand, cand_cost = best.copy(), best_cost
                kick = cfg.perturb_moves * 3
                since_restart = 0
                restarts += 1
            else:
                cand, cand_cost = cur.copy(), cur_cost
                kick = cfg.perturb_moves
            cand_cost = _perturb(S, cand, cand_cost, rng, kick, reach)
            cand, cand_cost, m, timed_out = insertion_local_search(S, cand, cand_cost, deadline)
            moves += m
            if cand_cost <= cur_cost + tol:
                cur, cur_cost = cand, cand_cost
            if cand_cost < best_cost - tol:
                best, best_cost = cand.copy(), cand_cost
                since_best = since_restart = 0
            else:
                since_best += 1
                since_restart += 1
            if timed_out:
                stopped_by = "time"
        stats = {
            "iters": iters,
            "moves": moves,
            "restarts": restarts,
            "stopped_by": stopped_by,
            "start_cost": start_cost,
        }
        return best, stats


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


@SolverConfig.register("ils")
@dataclass(frozen=True, kw_only=True)
class IlsConfig(SolverConfig):
    """Iterated insertion local search (the default solver)."""

    max_iters: int | None = 1000
    """Maximum perturbation + local-search rounds (None: no cap)."""
    patience: int | None = 200
    """Stop after this many rounds without a new best order (None: never)."""
    time_budget_s: float | None = None
    """Wall-clock cap in seconds (None: none); when it binds the result depends on machine speed."""
    perturb_moves: int = 3
    """Random insertion moves per perturbation (three times as many at a restart)."""
    perturb_reach: int = 8
    """Largest position shift of a perturbation move."""
    restart_after: int = 50
    """Rounds without a new best before the walk restarts from the best order."""

    def __post_init__(self) -> None:
        check_budget("ils", self.time_budget_s, self.max_iters)
        if self.patience is not None and self.patience < 1:
            raise ValueError(f"ils.patience must be >= 1 or None, got {self.patience!r}")
        if self.perturb_moves < 1:
            raise ValueError(f"ils.perturb_moves must be >= 1, got {self.perturb_moves!r}")
        if self.perturb_reach < 1:
            raise ValueError(f"ils.perturb_reach must be >= 1, got {self.perturb_reach!r}")
        if self.restart_after < 1:
            raise ValueError(f"ils.restart_after must be >= 1, got {self.restart_after!r}")

    def build(self) -> IlsSolver:
        return IlsSolver(self)
