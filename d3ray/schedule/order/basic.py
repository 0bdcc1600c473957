"""The baselines: stream order and a seeded uniform random order of each chunk."""

from __future__ import annotations

from d3ray.schedule.chunker import Chunk
from d3ray.schedule.scheduler import ChunkDecision, Decided, SchedulerBase, SubmitContext, random_order


class SequentialScheduler(SchedulerBase):
    """Stream order."""

    def submit(self, chunk: Chunk, batch_refs: tuple, context: SubmitContext) -> Decided:
        return Decided(ChunkDecision(order=tuple(range(chunk.size)), record={"scheduler": "sequential"}))


class RandomScheduler(SchedulerBase):
    """Uniform random order within each chunk, seeded by ``(seed, chunk_id)``."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def submit(self, chunk: Chunk, batch_refs: tuple, context: SubmitContext) -> Decided:
        order = random_order(chunk.size, self.seed, chunk.chunk_id)
        return Decided(ChunkDecision(order=order, record={"scheduler": "random"}))
