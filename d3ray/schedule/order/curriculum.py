"""Curricula within each chunk: difficulty scored one chunk ahead, sequences re-batched easy→hard
(or hard→easy). See :class:`~d3ray.schedule.order.configs.CurriculumScheduleConfig`."""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from d3ray.data.chunker import Chunk
from d3ray.ray_refs import Deadline, result_by_deadline
from d3ray.schedule.order.regroup import curriculum_groups
from d3ray.schedule.scheduler import (
    BuildContext,
    ChunkDecision,
    Decided,
    PendingDecision,
    SchedulerBase,
    SubmitContext,
)
from d3ray.schedule.scoring import start_scorer


class CurriculumScheduler(SchedulerBase):
    def __init__(self, cfg: Any, ctx: BuildContext) -> None:
        reference = None if cfg.reference == "current" else cfg.reference
        self.cfg = cfg
        self.scorer = start_scorer(ctx, reference, cfg.scorer_num_cpus, cfg.scorer_num_gpus, "curriculum-scorer")

    def submit(self, chunk: Chunk, batch_refs: tuple, context: SubmitContext) -> PendingDecision:
        if self.cfg.reference == "current" and context.weights is None:
            return Decided(stream_fallback(chunk, "no weights snapshot published in time"))
        ref = self.scorer.losses.remote(context.weights, list(batch_refs))
        return CurriculumPending(chunk, ref, self.cfg.direction == "hard_to_easy", time.perf_counter())

    def actors(self) -> dict[str, list[Any]]:
        return {"scorer": [self.scorer]}

    def close(self) -> None:
        import ray

        ray.kill(self.scorer)


def stream_fallback(chunk: Chunk, reason: str) -> ChunkDecision:
    return ChunkDecision(order=tuple(range(chunk.size)), fallback=True,
                         record={"scheduler": "curriculum", "fallback_reason": reason, "fallback_order": "stream"})


@dataclass
class CurriculumPending:
    chunk: Chunk
    scores_ref: Any
    hard_first: bool
    started: float

    def result(self, timeout_s: float | None) -> ChunkDecision:
        return result_by_deadline(self._decide, partial(stream_fallback, self.chunk), timeout_s)

    def _decide(self, deadline: Deadline) -> ChunkDecision:
        difficulty = deadline.get(self.scores_ref)
        groups = curriculum_groups(difficulty, self.chunk.batch_size, self.hard_first)
        means = [float(np.mean(difficulty[list(g)])) for g in groups]
        return ChunkDecision(order=tuple(range(len(groups))), selection=groups, record={
            "scheduler": "curriculum", "batch_difficulty": means,
            "schedule_sec": time.perf_counter() - self.started})
