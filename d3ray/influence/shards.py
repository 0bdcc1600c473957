"""Parameter shards: how one rank's slice of each parameter sits in the full vector, and how to sum
over ranks.

Sketches and the control variate's exact terms are linear over disjoint parameter slices (sketch.py:
P splits over shards with ``offsets=``; a dot product is the sum of its slices' dot products). So a
rank that holds elements [a, a + m) of every parameter can compute its part of every row and of every
inner product, and one sum over ranks (an all-reduce of a few k-vectors) gives the unsharded result.
What is not linear (a norm's square root, a product of two inner products, the AdamW direction's
gradient clip) is computed from the summed parts, never from one rank's. :class:`Shards` carries the
two things the pure functions need for this: the offsets and the sum. ``None`` everywhere means the
unsharded case (one process holds everything), which is the default of every function that takes one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

__all__ = ["Shards", "reduce_sum"]


@dataclass(frozen=True)
class Shards:
    """This rank's slices: ``offsets[name]`` is the index of its first element in the flattened
    parameter; ``reduce(t)`` returns the sum of ``t`` over all ranks (every rank calls it, in the same
    order: it is a collective, e.g. ``torch.distributed.all_reduce``)."""

    offsets: Mapping[str, int]
    reduce: Callable[[torch.Tensor], torch.Tensor]


def reduce_sum(shards: Shards | None, tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` summed over ranks (itself when unsharded)."""
    return tensor if shards is None else shards.reduce(tensor)
