"""The default solver: iterated insertion local search over a small population (a memetic algorithm).

Schiavinotto & Stützle (2004, J. Math. Model. Algorithms 3, "The linear ordering problem: instances,
search space analysis and algorithms") found two methods best for the linear ordering problem: an
iterated local search (ILS) and a memetic algorithm (MA) that recombines local optima and re-optimises
the offspring by insertion local search; the MA was the stronger of the two on random instances, which
our measurements on Gaussian S (K = 60) confirmed (twice the ILS's hit rate at equal work). This solver
is that MA, with ILS kicks as its mutation:

1. start: the insertion local optimum (:class:`~d3ray.solver.local_search.Descent`) from the
   best of ``init``, Row-Sum and Greedy Insertion in Row-Sum sequence (the greedy order is the best
   start at large K, where the descent is slow: at K = 1000 it alone beats RSR);
2. ILS phase: kick the best order (``perturb_moves`` random insertions of range <= ``perturb_reach``),
   descend, keep the result if better. Structured S (a planted order plus noise) is usually solved
   here, within a few dozen rounds;
3. memetic phase, after ``grow_after`` rounds without a new best: the population grows to
   ``population`` members, each a strong kick (min(K/2, 4 · ``perturb_moves``) insertions of any range)
   of the best order plus descent; then each round is an order-based crossover of two random members
   (each position of parent a kept with probability ``crossover_keep``, the other items filled in in
   parent b's relative order), with probability ``mutation_rate`` a kick, and a descent; the offspring
   replaces the worst member if it is better and its cost is not already in the population;
4. restart: after ``restart_after`` rounds in which the full population did not change (it has
   converged), it is emptied and regrown from random orders plus descent; the best order seen is kept
   aside. On Gaussian S (K = 60) restarts from random orders, not kicks of the best, are what moved the
   hit rate of the best-known cost within 100 ms from ~60% to ~97%: the converged population sits in
   one deep basin and kicks of its best stay there.

With ``population = 1`` this is a plain ILS with better-only acceptance. Stopping: ``max_iters`` rounds,
``patience`` rounds without a new best, or the wall clock ``time_budget_s``; only the last makes the
result depend on machine speed (``stats["stopped_by"] == "time"``). Rounds run compiled
(:func:`~d3ray.solver.memetic.memetic_rounds`, numba, imported when a search first runs), a slice of
~1 ms at a time between looks at the clock; a round is ~30 µs at K = 60 (a crossover, a scoring, ~4 O(K²) descent sweeps). Measured cost and quality per K are
in the README and ``d3ray bench solver``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from d3ray.solver.base import SolverBase, SolverConfig, check_budget
from d3ray.solver.greedy import greedy_insertion_order, row_sum_order
from d3ray.solver.local_search import Descent
from d3ray.solver.problem import ordering_cost

logger = logging.getLogger(__name__)

__all__ = ["IlsConfig", "IlsSolver"]


class IlsSolver(SolverBase):
    """Memetic iterated insertion local search (see the module docstring)."""

    config: IlsConfig

    def _search(self, S, init, init_cost, seed, deadline) -> tuple[np.ndarray, dict[str, Any]]:
        from d3ray.solver import kernels, memetic  # numba: imported by the first search, not by the config

        cfg = self.config
        t0 = time.perf_counter()
        K = S.shape[0]
        kernels.seed(seed)
        descend = Descent(S)
        start, start_cost = init.copy(), init_cost
        rows = row_sum_order(S, init)
        for order in (rows, None):
            if order is None:
                if time.perf_counter() > deadline:
                    break
                order = greedy_insertion_order(S, rows)
            cost = ordering_cost(S, order)
            if cost < start_cost:
                start, start_cost = order, cost
        first = start.astype(np.int64)
        first_cost, timed_out = descend(first, start_cost, deadline)
        members = np.empty((cfg.population, K), dtype=np.int64)
        costs = np.full(cfg.population, np.inf)
        members[0], costs[0] = first, first_cost
        best, best_cost = first.copy(), np.array([first_cost])
        state = np.zeros(8, dtype=np.int64)
        state[memetic.MEMBERS] = 1
        best_at_s = time.perf_counter() - t0
        stopped_by = "time" if timed_out else "max_iters"
        max_iters = cfg.max_iters if cfg.max_iters is not None else np.iinfo(np.int64).max
        patience = cfg.patience if cfg.patience is not None else -1
        reach = max(1, min(K - 1, cfg.perturb_reach))
        strong = max(cfg.perturb_moves, min(K // 2, 4 * cfg.perturb_moves))
        rounds_per_call = max(1, 200_000 // (K * K))  # ~1 ms of work between looks at the clock
        while not timed_out and K > 2:
            if time.perf_counter() > deadline:
                stopped_by = "time"
                break
            before = best_cost[0]
            why = memetic.memetic_rounds(
                descend.S, members, costs, best, best_cost, state, rounds_per_call, descend.tol,
                cfg.perturb_moves, reach, strong, cfg.grow_after, cfg.restart_after,
                cfg.crossover_keep, cfg.mutation_rate, max_iters, patience,
            )  # fmt: skip
            if best_cost[0] < before:
                best_at_s = time.perf_counter() - t0
            if why != memetic.SLICE_DONE:
                stopped_by = "max_iters" if why == memetic.MAX_ITERS else "patience"
                break
        stats = {
            "iters": int(state[memetic.ITERS]),
            "moves": descend.moves + int(state[memetic.MOVES]),
            "sweeps": descend.sweeps + int(state[memetic.SWEEPS]),
            "stopped_by": stopped_by,
            "start_cost": start_cost,
            "best_at_iter": int(state[memetic.BEST_AT_ITER]),
            "best_at_s": best_at_s,
            "restarts": int(state[memetic.RESTARTS]),
        }
        return best, stats


@SolverConfig.register("ils")
@dataclass(frozen=True, kw_only=True)
class IlsConfig(SolverConfig):
    """Memetic iterated insertion local search, the default solver."""

    max_iters: int | None = 2000
    """Rounds (offspring = crossover/kick + local search) at most; None: no cap."""
    patience: int | None = 500
    """Stop after this many rounds without a new best order; None: never."""
    time_budget_s: float | None = None
    """Wall-clock cap in seconds (None: none); when it binds the result depends on machine speed."""
    population: int = 8
    """Local optima kept; 1 turns the solver into a plain ILS."""
    grow_after: int = 10
    """Rounds without a new best that the single-order ILS phase runs before the population grows."""
    crossover_keep: float = 0.5
    """Probability that a position keeps the first parent's item in the order-based crossover."""
    mutation_rate: float = 0.3
    """Probability that an offspring also gets a random kick before its local search."""
    restart_after: int = 30
    """Rounds without a change to the full population after which it is rebuilt from random orders."""
    perturb_moves: int = 7
    """Random insertion moves per kick."""
    perturb_reach: int = 15
    """Largest position shift of a kick move."""
    potential_tol: float = 0.0
    """Order by the fitted potential without a search when ‖residual‖_F ≤ potential_tol · ‖potential‖_F
    (solver/potential.py; logged, ``stats["exact"]`` False). 0: only when the sort is certified optimal
    (cost 0), which every solver does."""

    def __post_init__(self) -> None:
        check_budget("ils", self.time_budget_s, self.max_iters)
        if self.patience is not None and self.patience < 1:
            raise ValueError(f"ils.patience must be >= 1 or None, got {self.patience!r}")
        if self.population < 1:
            raise ValueError(f"ils.population must be >= 1, got {self.population!r}")
        if self.grow_after < 0:
            raise ValueError(f"ils.grow_after must be >= 0, got {self.grow_after!r}")
        if not 0.0 < self.crossover_keep < 1.0:
            raise ValueError(f"ils.crossover_keep must be in (0, 1), got {self.crossover_keep!r}")
        if not 0.0 <= self.mutation_rate <= 1.0:
            raise ValueError(f"ils.mutation_rate must be in [0, 1], got {self.mutation_rate!r}")
        if self.restart_after < 1:
            raise ValueError(f"ils.restart_after must be >= 1, got {self.restart_after!r}")
        if self.perturb_moves < 1:
            raise ValueError(f"ils.perturb_moves must be >= 1, got {self.perturb_moves!r}")
        if not self.potential_tol >= 0:
            raise ValueError(f"ils.potential_tol must be >= 0, got {self.potential_tol!r}")
        if self.perturb_reach < 1:
            raise ValueError(f"ils.perturb_reach must be >= 1, got {self.perturb_reach!r}")

    def build(self) -> IlsSolver:
        return IlsSolver(self)
