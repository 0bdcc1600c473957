"""Order schedulers that re-batch a chunk's sequences (curricula, mtl): the pure regrouping rules.

Both return ``selection`` = the chunk's flat candidate indices (``batch * B + row``) cut into batches
of B in training order, with nothing skipped; the decision's ``order`` is then the identity.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np


def batches_of(indices: list[int], batch_size: int) -> tuple[tuple[int, ...], ...]:
    """Consecutive groups of ``batch_size`` (``len(indices)`` must be a multiple of it)."""
    if len(indices) % batch_size:
        raise ValueError(f"{len(indices)} sequences do not fill batches of {batch_size}")
    return tuple(tuple(indices[i:i + batch_size]) for i in range(0, len(indices), batch_size))


def curriculum_groups(difficulty: np.ndarray, batch_size: int, hard_first: bool) -> tuple[tuple[int, ...], ...]:
    """Sequences sorted by difficulty (ties: stream order), easy→hard or hard→easy, in batches of B."""
    d = np.asarray(difficulty, dtype=np.float64)
    if not np.all(np.isfinite(d)):
        raise ValueError("difficulty has non-finite values")
    key = -d if hard_first else d
    order = np.lexsort((np.arange(len(d)), key))  # primary: key, then index
    return batches_of([int(i) for i in order], batch_size)


def round_robin_groups(domains: list[str], batch_size: int) -> tuple[tuple[int, ...], ...]:
    """Sequences dealt in turns over their domains (sorted by name; stream order within a domain),
    so that every batch mixes the domains as evenly as their counts allow."""
    by_domain: dict[str, list[int]] = defaultdict(list)
    for i, d in enumerate(domains):
        by_domain[d].append(i)
    queues = [by_domain[d] for d in sorted(by_domain)]
    dealt: list[int] = []
    depth = 0
    while len(dealt) < len(domains):
        dealt.extend(q[depth] for q in queues if depth < len(q))
        depth += 1
    return batches_of(dealt, batch_size)
