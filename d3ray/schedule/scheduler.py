"""The scheduler interface and the order-only built-ins (sequential, random).

A scheduler turns a chunk into a training order. It works in two phases so that slow
schedulers (D3: influence + solving) run one chunk ahead of the trainers:
``submit(chunk, batch_refs, weights)`` starts the work and returns a :class:`PendingOrder`;
``PendingOrder.result(timeout_s)`` returns the :class:`ChunkDecision` (or the fallback order
when the deadline passes). Order-only schedulers decide immediately.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from d3ray.schedule.chunker import Chunk
from d3ray.schedule.config import RandomScheduleConfig, ScheduleConfig, SequentialScheduleConfig


@dataclass(frozen=True)
class ChunkDecision:
    """The order chosen for one chunk and what to log about it.

    Attributes:
        order: positions into ``chunk.batches`` in training order (a permutation of range(L)).
        fallback: True when the scheduler missed its deadline or failed and this is the fallback.
        record: fields for the schedule log (solver, costs, seconds, ...).
    """

    order: tuple[int, ...]
    fallback: bool = False
    record: dict[str, Any] = field(default_factory=dict)
    matrix: np.ndarray | None = None
    """The chunk's S (L, L) when the scheduler computed one (saved by trainer rank 0)."""


class PendingOrder(Protocol):
    def result(self, timeout_s: float | None) -> ChunkDecision: ...


class Scheduler(Protocol):
    """Orders chunks.

    ``batch_refs`` holds one ObjectRef per batch of the chunk (already in the object store);
    ``weights`` is the newest allowed weights snapshot (``[ObjectRef]``) or None.
    """

    def submit(self, chunk: Chunk, batch_refs: tuple, weights: list | None) -> PendingOrder: ...


@dataclass(frozen=True)
class DecidedOrder:
    """A decision available at once."""

    decision: ChunkDecision

    def result(self, timeout_s: float | None) -> ChunkDecision:
        return self.decision


def random_order(chunk_len: int, seed: int, chunk_id: int) -> tuple[int, ...]:
    """The baseline's order: a uniform permutation seeded by ``(seed, chunk_id)``."""
    return tuple(int(i) for i in np.random.default_rng([seed, chunk_id]).permutation(chunk_len))


class SequentialScheduler:
    """Stream order."""

    def __init__(self, cfg: SequentialScheduleConfig, seed: int) -> None:
        self.cfg = cfg

    def submit(self, chunk: Chunk, batch_refs: tuple, weights: list | None) -> PendingOrder:
        return DecidedOrder(ChunkDecision(order=tuple(range(chunk.size)), record={"scheduler": "sequential"}))


class RandomScheduler:
    """Uniform random order within each chunk."""

    def __init__(self, cfg: RandomScheduleConfig, seed: int) -> None:
        self.cfg = cfg
        self.seed = seed

    def submit(self, chunk: Chunk, batch_refs: tuple, weights: list | None) -> PendingOrder:
        order = random_order(chunk.size, self.seed, chunk.chunk_id)
        return DecidedOrder(ChunkDecision(order=order, record={"scheduler": "random"}))


def build_scheduler(cfg: ScheduleConfig, seed: int, **resources: Any) -> Scheduler:
    """Instantiate the scheduler for ``cfg`` (``resources`` carries actor pools for D3)."""
    if isinstance(cfg, RandomScheduleConfig):
        return RandomScheduler(cfg, seed)
    if isinstance(cfg, SequentialScheduleConfig):
        return SequentialScheduler(cfg, seed)
    build = getattr(cfg, "build", None)
    if build is None:
        raise ValueError(f"schedule.type={cfg.type_name!r} has no scheduler implementation")
    return build(seed=seed, **resources)
