"""Compiled inner loops of the local searches (numba): insertion descent, kicks, crossover, scoring.

Why compiled: at the chunk sizes D3 uses (L = 20-200) a search is millions of O(1) steps over a
K x K matrix that fits in cache; numpy's per-call overhead (~1 µs x ~11 calls per neighbourhood pass)
dominated the old vectorised descent. ``d3ray bench solver`` measures the result: the compiled memetic
search does ~20x more rounds per second at K = 60 (numbers in the package README).

Randomness comes from numba's generator, which is per thread: a solve calls :func:`seed` first and
runs in one thread, so its result depends only on its seed (a ``numpy.random.Generator`` call costs
~7 µs, as much as a local-search sweep at K = 60, hence the compiled generator).
Kernels are compiled on first use and cached on disk (``cache=True``), so a new process (a Ray solver
actor) pays the compilation once per machine, not once per chunk.

Move deltas are eq. 1 and eq. 2 of :mod:`d3ray.solver.problem`: moving item x past item y changes the
cost by exactly S[x, y] (S antisymmetric), so scanning from position p outwards accumulates the
deltas of all moves of one item in O(K).
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = [
    "best_insertion",
    "coin",
    "crossover",
    "descend",
    "kick",
    "order_cost",
    "pick_two",
    "seed",
]


@njit(cache=True)
def order_cost(S: np.ndarray, order: np.ndarray) -> float:
    """The D3 objective Σ_{a<b} max(0, S[order[b], order[a]]) in O(K²) (as ``ordering_cost``)."""
    K = order.shape[0]
    total = 0.0
    for b in range(1, K):
        row = S[order[b]]
        for a in range(b):
            v = row[order[a]]
            if v > 0.0:
                total += v
    return total


@njit(cache=True)
def best_insertion(S: np.ndarray, order: np.ndarray, p: int) -> tuple[int, float]:
    """Best position q for the item at position p and Δ(p → q) (eq. 1), O(K); (p, 0.0) if none is < 0."""
    K = order.shape[0]
    row = S[order[p]]
    best_q, best = p, 0.0
    acc = 0.0
    for q in range(p + 1, K):  # x passes order[q]: Δ += S[x, order[q]]
        acc += row[order[q]]
        if acc < best:
            best, best_q = acc, q
    acc = 0.0
    for q in range(p - 1, -1, -1):  # order[q] passes x: Δ += S[order[q], x] = −S[x, order[q]]
        acc -= row[order[q]]
        if acc < best:
            best, best_q = acc, q
    return best_q, best


@njit(cache=True)
def _move(order: np.ndarray, p: int, q: int) -> None:
    """Insertion move p → q in place (``apply_insertion``)."""
    x = order[p]
    if q > p:
        for t in range(p, q):
            order[t] = order[t + 1]
    else:
        for t in range(p, q, -1):
            order[t] = order[t - 1]
    order[q] = x


@njit(cache=True)
def descend(S: np.ndarray, order: np.ndarray, tol: float, max_sweeps: int) -> tuple[float, int, int, bool]:
    """First-improvement insertion descent (Schiavinotto & Stützle 2004, LS_f), in place.

    Sweeps the positions left to right; each item moves to its best position (eq. 1) if that lowers
    the cost by more than ``tol``. Stops after a sweep without a move (a local optimum of the insertion
    neighbourhood, hence also of adjacent swaps) or after ``max_sweeps`` sweeps.

    Returns:
        (cost change, moves applied, sweeps run, reached a local optimum).
    """
    K = order.shape[0]
    change = 0.0
    moves = 0
    for sweep in range(max_sweeps):
        moved = False
        for p in range(K):
            q, d = best_insertion(S, order, p)
            if d < -tol:
                _move(order, p, q)
                change += d
                moves += 1
                moved = True
        if not moved:
            return change, moves, sweep + 1, True
    return change, moves, max_sweeps, False


@njit(cache=True)
def seed(value: int) -> None:
    """Seed this thread's compiled generator (used by :func:`kick`, :func:`crossover`, :func:`pick_two`)."""
    np.random.seed(value)


@njit(cache=True)
def coin(p: float) -> bool:
    """True with probability p."""
    return np.random.random() < p


@njit(cache=True)
def permutation(n: int) -> np.ndarray:
    """A uniformly random permutation of range(n) (int64)."""
    return np.random.permutation(n)


@njit(cache=True)
def pick_two(n: int) -> tuple[int, int]:
    """Two distinct indices drawn uniformly from range(n), n >= 2."""
    i = np.random.randint(n)
    j = (i + 1 + np.random.randint(n - 1)) % n
    return i, j


@njit(cache=True)
def kick(S: np.ndarray, order: np.ndarray, moves: int, reach: int) -> float:
    """Perturb ``order`` in place by ``moves`` random insertion moves, each over 1..``reach`` positions.

    A move takes a uniform position p and a uniform nonzero offset in [−reach, reach], clipped to the
    ends of the order.

    Returns:
        The cost change of all the moves (eq. 1), O(moves · reach).
    """
    K = order.shape[0]
    change = 0.0
    for _ in range(moves):
        p = np.random.randint(K)
        offset = np.random.randint(1, reach + 1)
        if np.random.random() < 0.5:
            offset = -offset
        q = min(K - 1, max(0, p + offset))
        row = S[order[p]]
        for r in range(p + 1, q + 1):
            change += row[order[r]]
        for r in range(q, p):
            change -= row[order[r]]
        if q != p:
            _move(order, p, q)
    return change


@njit(cache=True)
def crossover(a: np.ndarray, b: np.ndarray, keep: float) -> np.ndarray:
    """Order-based crossover: each position keeps a's item with probability ``keep``; the other items
    fill the remaining positions in b's relative order."""
    K = a.shape[0]
    keep_position = np.random.random(K) < keep
    kept_item = np.zeros(K, dtype=np.bool_)
    for t in range(K):
        if keep_position[t]:
            kept_item[a[t]] = True
    child = a.copy()
    j = 0
    for t in range(K):
        if keep_position[t]:
            continue
        while kept_item[b[j]]:
            j += 1
        child[t] = b[j]
        j += 1
    return child

