"""The memetic search's compiled rounds (numba): phases 2-4 of :mod:`d3ray.solver.ils`, a slice at a time.

Apart from :mod:`d3ray.solver.ils` so that importing the solver configs (every process that reads a run
config: trainers, coordinator, actors) does not import numba (~0.4-0.8 s): the search imports this module
when it first runs.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from d3ray.solver import kernels

__all__ = ["memetic_rounds"]


# Slots of the integer state vector that carries the search across calls of memetic_rounds.
ITERS, SINCE_BEST, SINCE_CHANGE, RESTARTS, MEMBERS, BEST_AT_ITER, MOVES, SWEEPS = range(8)
# Why memetic_rounds returned.
SLICE_DONE, MAX_ITERS, PATIENCE = 0, 1, 2


@njit(cache=True)
def memetic_rounds(
    S: np.ndarray,
    members: np.ndarray,
    costs: np.ndarray,
    best: np.ndarray,
    best_cost: np.ndarray,
    state: np.ndarray,
    rounds: int,
    tol: float,
    perturb_moves: int,
    reach: int,
    strong_moves: int,
    grow_after: int,
    restart_after: int,
    crossover_keep: float,
    mutation_rate: float,
    max_iters: int,
    patience: int,
) -> int:
    """Run up to ``rounds`` rounds of the search (phases 2-4 of the module docstring), compiled.

    The search state lives in the arrays, updated in place, so the caller can check the wall clock
    between calls: ``members`` (P, K) int64 population (its first ``state[MEMBERS]`` rows are valid),
    ``costs`` (P,), ``best`` (K,) and ``best_cost`` (1,) the best order seen, ``state`` the counters
    indexed by ``ITERS`` ... ``SWEEPS``. ``patience`` < 0 means none.

    Returns:
        ``SLICE_DONE``, ``MAX_ITERS`` or ``PATIENCE``.
    """
    P, K = members.shape
    big = 1 << 30
    for _ in range(rounds):
        if state[ITERS] >= max_iters:
            return MAX_ITERS
        if patience >= 0 and state[SINCE_BEST] >= patience:
            return PATIENCE
        state[ITERS] += 1
        state[SINCE_BEST] += 1
        state[SINCE_CHANGE] += 1
        n = state[MEMBERS]
        ils_phase = n == 1 and (P == 1 or state[SINCE_BEST] <= grow_after)
        if ils_phase:  # kick the single member
            child = members[0].copy()
            cost = costs[0] + kernels.kick(S, child, perturb_moves, reach)
        elif n < P and state[RESTARTS] == 0:  # grow the population: strong kicks of the best
            child = best.copy()
            cost = best_cost[0] + kernels.kick(S, child, strong_moves, K - 1)
        elif n < P:  # regrow after a restart: random orders
            child = kernels.permutation(K)
            cost = kernels.order_cost(S, child)
        else:
            i, j = kernels.pick_two(n)
            child = kernels.crossover(members[i], members[j], crossover_keep)
            cost = kernels.order_cost(S, child)
            if kernels.coin(mutation_rate):
                cost += kernels.kick(S, child, perturb_moves, reach)
        change, moves, sweeps, _ = kernels.descend(S, child, tol, big)
        cost += change
        state[MOVES] += moves
        state[SWEEPS] += sweeps
        if cost < best_cost[0] - tol:
            best[:] = child
            best_cost[0] = cost
            state[BEST_AT_ITER] = state[ITERS]
            state[SINCE_BEST] = 0
        duplicate = False
        for m in range(n):
            if abs(costs[m] - cost) <= tol:
                duplicate = True  # already in the population (by cost)
        if duplicate:
            pass
        elif ils_phase:
            if cost < costs[0]:
                members[0] = child
                costs[0] = cost
                state[SINCE_CHANGE] = 0
        elif n < P:
            members[n] = child
            costs[n] = cost
            state[MEMBERS] = n + 1
            state[SINCE_CHANGE] = 0
        else:
            worst = np.argmax(costs)
            if cost < costs[worst]:
                members[worst] = child
                costs[worst] = cost
                state[SINCE_CHANGE] = 0
        if P > 1 and state[MEMBERS] == P and state[SINCE_CHANGE] >= restart_after:
            state[MEMBERS] = 0  # converged: regrow from random orders
            state[SINCE_CHANGE] = 0
            state[RESTARTS] += 1
    return SLICE_DONE
