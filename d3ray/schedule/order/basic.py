"""The baselines: stream order and a seeded uniform random order of each chunk."""

from __future__ import annotations

from d3ray.data.chunker import Chunk
from d3ray.schedule.scheduler import ChunkDecision, Decided, SchedulerBase, SubmitContext, random_order


class SequentialScheduler(SchedulerBase):
    """Stream order."""

    def submit(self, chunk: Chunk, batch_refs: tuple, context: SubmitContext) -> Decided:
        return Decided(ChunkDecision(order=tuple(range(chunk.size)), record={"scheduler": "sequential"}))


class RandomScheduler(SchedulerBase):
    """Uniform random order within each chunk, seeded by ``(seed, chunk_id)``; with an ``order_seed``
    other than 0, by ``(seed, chunk_id, order_seed)``: an independent order of the same chunks."""

    def __init__(self, seed: int, order_seed: int = 0) -> None:
        self.seed = seed
        self.order_seed = order_seed

    def submit(self, chunk: Chunk, batch_refs: tuple, context: SubmitContext) -> Decided:
        order = random_order(chunk.size, self.seed, chunk.chunk_id, self.order_seed)
        return Decided(ChunkDecision(order=order, record={"scheduler": "random"}))
