"""The recency control's ramp layout: a chunk's sequences re-dealt so one domain's count rises over its batches.

    chunk (L batches of B rows, stream order) ─► the rows of ``domain`` and the others, each in stream order
        ─► batch i takes c_i rows of ``domain`` and B − c_i others, c = ramp_counts(n, L, B): as linear in i
           as 0 <= c_i <= B and Σ c_i = n allow

Why: the recency control scores ``recency_last`` (the batches with most of the domain last) by its z
against random orders of the same batches. If the domain's held-out loss is linear in where its sequences
sit, a sort of the batches by count is as far from a random order as the counts allow: the z of a sort is
√(L − 1) times the correlation of the counts with a linear ramp (about 2.65 at L = 8 for an exact ramp),
and the stream's own counts, drawn by chance, reach only part of it. Every order of the census then
trains the re-dealt chunk (S, D3's order and the random orders see the same batches), as the planted
control trains its planted chunk. Pure functions, no Ray and no torch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from d3ray.data.chunker import concat_batches

__all__ = ["ramp_chunk", "ramp_counts"]


def ramp_counts(n: int, L: int, B: int) -> list[int]:
    """Counts c_0..c_{L−1} of ``n`` rows over ``L`` batches of ``B`` rows, rising as linearly as allowed.

    The line through the mean n/L with the largest half-range h that keeps it inside [0, B]
    (h = min(n/L, B − n/L)): t_i = n/L + h·(2i/(L − 1) − 1), rounded by largest remainder so that Σ c_i = n.

    Example: L = 8, B = 16: n = 20 → (0, 1, 1, 2, 3, 4, 4, 5); n = 120 (h = 1) → (14, 14, 15, 15, 15, 15, 16, 16).

    Raises:
        ValueError: n outside 0..L·B, or L, B < 1.
    """
    if L < 1 or B < 1 or not 0 <= n <= L * B:
        raise ValueError(f"ramp_counts: need L, B >= 1 and 0 <= n <= L·B, got n={n}, L={L}, B={B}")
    mean = n / L
    half = min(mean, B - mean)
    target = np.array([mean + (half * (2 * i / (L - 1) - 1) if L > 1 else 0.0) for i in range(L)])
    counts = np.floor(target + 1e-9).astype(int)
    short = n - int(counts.sum())
    for i in sorted(range(L), key=lambda i: (-(target[i] - counts[i]), -i))[:short]:  # largest remainders, later first
        counts[i] += 1
    return [int(c) for c in counts]


def ramp_chunk(batches: list[Any], domain: str) -> list[Any]:
    """The chunk's rows re-dealt over its batches (``GlobalBatch``es of one size B) so that batch i holds
    c_i rows of ``domain`` (:func:`ramp_counts`), the domain's rows and the others each in stream order.
    Every row trains exactly once, with its tokens, lengths, masks, sample id and domain.

    Example: 2 batches of 2 rows with domains (a, x), (x, b) and domain x → (a, b), (x, x).

    Raises:
        ValueError: batches of different sizes.
    """
    sizes = {len(b.domains) for b in batches}
    if len(sizes) != 1:
        raise ValueError(f"ramp_chunk: the chunk's batches hold different numbers of rows {sorted(sizes)}")
    (B,) = sizes
    rows = concat_batches(list(batches))
    mine = [r for r, d in enumerate(rows.domains) if d == domain]
    others = [r for r, d in enumerate(rows.domains) if d != domain]
    out = []
    for c in ramp_counts(len(mine), len(batches), B):
        take, mine = mine[:c], mine[c:]
        rest, others = others[: B - c], others[B - c :]
        out.append(rows.rows(sorted(take + rest)))
    return out
