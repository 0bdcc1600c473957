"""The orders a census trains each chunk in: pure functions on permutations of range(L).

    D3's order σ ─► reverse(σ)        σ read backwards: as "sorted" as σ, with every pair flipped
               └─► alternate(σ)       σ[0], σ[L−1], σ[1], σ[L−2], ...: the two ends interleaved, the
                                      anti-sortedness control (a sort by one scalar becomes a zigzag)
    seeded random orders (R of them, a fixed stream per (seed, checkpoint, chunk)), all L! orders for small L

``census_orders`` names them and ``distinct_orders`` groups names that share one order (the run's
own order of a ``sequential`` run is the stream order): each distinct order trains once.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

Order = tuple[int, ...]

MAX_ALL_ORDERS_L = 5
"""All L! orders are offered up to this L (5! = 120 branches per chunk)."""


def reverse_order(order: Sequence[int]) -> Order:
    """``order`` read backwards."""
    return tuple(int(i) for i in reversed(order))


def alternate_order(order: Sequence[int]) -> Order:
    """The two ends of ``order`` interleaved: first, last, second, second to last, ...

    Example: (0, 1, 2, 3, 4) → (0, 4, 1, 3, 2).
    """
    out: list[int] = []
    lo, hi = 0, len(order) - 1
    while lo <= hi:
        out.append(int(order[lo]))
        if lo != hi:
            out.append(int(order[hi]))
        lo, hi = lo + 1, hi - 1
    return tuple(out)


def random_orders(L: int, count: int, seed: int, checkpoint: int, chunk_id: int) -> list[Order]:
    """``count`` uniformly random permutations of range(L), a fixed stream per (seed, checkpoint, chunk):
    the same census gives the same orders, and a larger ``count`` extends the list it gave before."""
    rng = np.random.default_rng([seed, checkpoint, chunk_id])
    return [tuple(int(i) for i in rng.permutation(L)) for _ in range(count)]


def all_orders(L: int) -> list[Order]:
    """Every permutation of range(L), lexicographically.

    Raises:
        ValueError: L > MAX_ALL_ORDERS_L (L! branches would not fit a census).
    """
    if L > MAX_ALL_ORDERS_L:
        raise ValueError(f"all orders of L={L} batches are {math.factorial(L)} branches; only L <= {MAX_ALL_ORDERS_L}")
    return [tuple(p) for p in itertools.permutations(range(L))]


def census_orders(L: int, *, run: Sequence[int] | None, d3: Sequence[int] | None, lookahead: Sequence[int] | None,
                  random: Sequence[Order], every: Sequence[Order] = ()) -> dict[str, Order]:
    """Name → order of one chunk: ``stream``, ``run`` (the order the run trained), ``d3``, ``d3_reverse``,
    ``d3_alternate``, the same three for ``lookahead``, ``random_<i>`` and ``perm_<i>`` (all orders)."""
    named: dict[str, Order] = {"stream": tuple(range(L))}
    if run is not None:
        named["run"] = tuple(int(i) for i in run)
    for name, order in (("d3", d3), ("lookahead", lookahead)):
        if order is not None:
            named[name] = tuple(int(i) for i in order)
            named[f"{name}_reverse"] = reverse_order(order)
            named[f"{name}_alternate"] = alternate_order(order)
    named.update({f"random_{i}": tuple(o) for i, o in enumerate(random)})
    named.update({f"perm_{i}": tuple(o) for i, o in enumerate(every)})
    for name, order in named.items():
        if sorted(order) != list(range(L)):
            raise ValueError(f"order {name} = {order} is not a permutation of range({L})")
    return named


def distinct_orders(named: dict[str, Order]) -> list[tuple[Order, list[str]]]:
    """The distinct orders of ``named``, each with the names that share it, in first-seen order."""
    groups: dict[Order, list[str]] = {}
    for name, order in named.items():
        groups.setdefault(order, []).append(name)
    return list(groups.items())


def control_domain(batch_domains: Sequence[Sequence[str]], domain: str | None = None) -> str:
    """The domain of the recency control for one chunk: ``domain`` if given, else the one whose count per
    batch varies most across the chunk's batches (max − min; ties: alphabetical), whose placement an order
    can move most."""
    if domain is not None:
        return domain
    names = sorted({d for ds in batch_domains for d in ds})
    spread = {n: max(ds.count(n) for ds in batch_domains) - min(ds.count(n) for ds in batch_domains) for n in names}
    return max(names, key=lambda n: (spread[n], [-ord(ch) for ch in n]))


def recency_orders(batch_domains: Sequence[Sequence[str]], domain: str) -> dict[str, Order]:
    """The recency control's orders: ``recency_last`` puts the batches with most ``domain`` sequences last
    (ascending count, ties in stream order), ``recency_first`` is its reverse. Trained last, a domain's
    batches leave the held-out loss of that domain lowest: the answer the census must find.

    Example: counts (2, 0, 3, 1) → recency_last (1, 3, 0, 2), recency_first (2, 0, 3, 1).
    """
    counts = [list(ds).count(domain) for ds in batch_domains]
    last = tuple(sorted(range(len(counts)), key=lambda i: (counts[i], i)))
    return {"recency_last": last, "recency_first": reverse_order(last)}
