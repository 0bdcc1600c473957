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


class InsertionDescent:
    """Steepest-descent in the insertion neighbourhood of one S, with its per-K buffers built once.

    Each pass evaluates all K² insertion moves at once (eq. 1) and applies, best first, every
    improving move whose position range [min(p, q), max(p, q)] is disjoint from those of the moves
    already applied in the pass: such moves commute and leave each other's deltas exact, so one O(K²)
    pass can apply many moves (the descent from Row-Sum at K = 1000 needs a few dozen passes, not K).

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

    def __call__(self, order: np.ndarray, deadline: float = float("inf")) -> tuple[np.ndarray, float, int, bool]:
        """Descend from ``order`` (modified in place) to a local optimum.

        Returns:
            (order, cost, moves applied, timed_out); ``cost`` is recomputed by the last pass.
        """
        S, K, diag, tol = self.S, self.K, self.diag, self.tol
        moves = 0
        while True:
            self.passes += 1
            P = S[order][:, order]  # (K, K) position space: P[p, k] = S[order[p], order[k]]
            C = np.cumsum(P, axis=1)  # (K, K) C[p, q] = Σ_{k<=q} P[p, k]
            own = C[diag, diag]  # (K,) = Σ_{k<p} P[p, k] since P[p, p] = 0
            # forward weight Σ_{p<k} P[p, k] = Σ_p (C[p, K-1] − C[p, p])
            cost = self.half_total - 0.5 * float(C[:, -1].sum() - own.sum())
            if time.perf_counter() > deadline:
                return order, cost, moves, True
            # eq. 1: D[p, q] = C[p, q] − C[p, p] for q > p and C[p, q − 1] − C[p, p] for q < p.
            D = C - own[:, None]
            D -= P * self.lower
            qbest = D.argmin(axis=1)
            dbest = D[diag, qbest]
            cand = np.flatnonzero(dbest < -tol)
            if cand.size == 0:
                return order, cost, moves, False
            if cand.size == 1:
                apply_insertion(order, int(cand[0]), int(qbest[cand[0]]))
                moves += 1
                continue
            cand = cand[np.argsort(dbest[cand], kind="stable")]
            busy = np.zeros(K, dtype=bool)  # positions inside the range of a move applied in this pass
            for p, q in zip(cand.tolist(), qbest[cand].tolist(), strict=True):
                lo, hi = (p, q) if p < q else (q, p)
                if not busy[lo : hi + 1].any():
                    busy[lo : hi + 1] = True
                    apply_insertion(order, p, q)
                    moves += 1


def insertion_local_search(
    S: np.ndarray, order: np.ndarray, deadline: float = float("inf")
) -> tuple[np.ndarray, float, int, bool]:
    """Descend to a local optimum of the insertion neighbourhood; see :class:`InsertionDescent`.

    Args:
        S: (K, K) antisymmetric advantage.
        order: (K,) permutation, modified in place.
        deadline: ``time.perf_counter()`` value after which to stop (the order may then not be optimal).

    Returns:
        (order, cost, moves applied, timed_out).
    """
    return InsertionDescent(S)(order, deadline)


def _perturb(order: np.ndarray, rng: np.random.Generator, moves: int, reach: int) -> None:
    """Apply ``moves`` random insertion moves of range <= ``reach`` to ``order`` in place."""
    K = order.shape[0]
    for _ in range(moves):
        p = int(rng.integers(K))
        lo, hi = max(0, p - reach), min(K - 1, p + reach)
        q = int(rng.integers(lo, hi))
        q += q >= p  # uniform over [lo, hi] \ {p}
        apply_insertion(order, p, q)


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
        descend = InsertionDescent(S)
        cur, cur_cost, moves, timed_out = descend(start.copy(), deadline)
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
                cand, kick = best.copy(), cfg.perturb_moves * 3
                since_restart = 0
                restarts += 1
            else:
                cand, kick = cur.copy(), cfg.perturb_moves
            _perturb(cand, rng, kick, reach)
            cand, cand_cost, m, timed_out = descend(cand, deadline)
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
            "passes": descend.passes,
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
