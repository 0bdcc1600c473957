"""The multi-task learning baseline: every batch deals the chunk's domains in turns (see MtlScheduleConfig)."""

from __future__ import annotations

from d3ray.data.chunker import Chunk
from d3ray.schedule.order.regroup import round_robin_groups
from d3ray.schedule.scheduler import ChunkDecision, Decided, SchedulerBase, SubmitContext


class MtlScheduler(SchedulerBase):
    def __init__(self, seed: int) -> None:
        self.seed = seed

    def submit(self, chunk: Chunk, batch_refs: tuple, context: SubmitContext) -> Decided:
        domains = [d for batch in chunk.batches for d in batch.domains]
        groups = round_robin_groups(domains, chunk.batch_size)
        return Decided(ChunkDecision(order=tuple(range(len(groups))), selection=groups,
                                     record={"scheduler": "mtl", "domains": len(set(domains))}))
