"""What every selector shares: the window, the warm-up and update cadence, keep-the-top-k, fallbacks.

    window of W = ⌈L / fraction⌉ candidate batches (n = W·B sequences)
      │ warm-up chunks, and chunks between updates: a seeded random subset   (DataFlex warmup_step /
      │ scored chunks: the algorithm's scores (one chunk ahead, on actors)   update_step, in chunks)
      ▼
    keep the k = min(L, ⌊W·fraction⌋)·B best scores (ties: stream order), regrouped in stream order
    into batches of B; every other candidate is skipped with reason ``not_selected``
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from d3ray.data.chunker import Chunk
from d3ray.ray_refs import Deadline, is_object_ref, result_by_deadline
from d3ray.schedule.order.regroup import batches_of
from d3ray.schedule.scheduler import ChunkDecision, Decided, PendingDecision, SchedulerBase, SubmitContext

NOT_SELECTED = "not_selected"


def keep_count(n_batches: int, L: int, fraction: float) -> int:
    """Batches kept of a window of ``n_batches`` (at least 1)."""
    return max(1, min(L, math.floor(n_batches * fraction + 1e-9)))


def top_k_decision(scores: np.ndarray, k_batches: int, batch_size: int, record: dict[str, Any]) -> ChunkDecision:
    """Keep the ``k_batches·B`` highest scores (ties: earlier candidate first), in stream order."""
    scores = np.asarray(scores, dtype=np.float64)
    if not np.all(np.isfinite(scores)):
        raise ValueError("selection scores have non-finite values")
    k = k_batches * batch_size
    ranked = np.lexsort((np.arange(len(scores)), -scores))  # primary: score descending
    kept = sorted(int(i) for i in ranked[:k])
    skipped = sorted(int(i) for i in ranked[k:])
    selection = batches_of(kept, batch_size)
    return ChunkDecision(order=tuple(range(len(selection))), selection=selection,
                         skipped={NOT_SELECTED: tuple(skipped)} if skipped else {}, record=record)


def random_scores(n: int, seed: int, chunk_id: int) -> np.ndarray:
    """Seeded uniform scores: keeping their top k is a uniform random subset."""
    return np.random.default_rng([seed, chunk_id, 7919]).random(n)


class SelectHead(SchedulerBase):
    """Base of the selectors: subclasses implement ``score(chunk, batch_refs, context)`` → pending scores.

    Args:
        cfg: the selector's config (``L``, ``fraction``, ``warmup_chunks``, ``update_every``).
        seed: run seed (random subsets of warm-up chunks and of chunks between updates).
        name: the scheduler name in the schedule log.
    """

    def __init__(self, cfg: Any, seed: int, name: str) -> None:
        self.cfg = cfg
        self.seed = seed
        self.name = name

    def is_scored(self, chunk_id: int) -> bool:
        after = chunk_id - self.cfg.warmup_chunks
        return after >= 0 and after % self.cfg.update_every == 0

    def submit(self, chunk: Chunk, batch_refs: tuple, context: SubmitContext) -> PendingDecision:
        k = keep_count(chunk.size, self.cfg.L, self.cfg.fraction)
        n = chunk.size * chunk.batch_size
        if not self.is_scored(chunk.chunk_id):
            scores = random_scores(n, self.seed, chunk.chunk_id)
            return Decided(top_k_decision(scores, k, chunk.batch_size, {"scheduler": self.name, "selected_by": "random"}))
        try:
            scores = self.score(chunk, batch_refs, context)
        except ValueError as err:  # e.g. no weights snapshot in time: the chunk still trains
            return Decided(self.fallback(chunk, str(err)))
        return ScoredPending(self, chunk, k, scores, time.perf_counter())

    def score(self, chunk: Chunk, batch_refs: tuple, context: SubmitContext) -> Any:
        """An ObjectRef (or array) of the (n,) scores of the window's candidates; higher = keep."""
        raise NotImplementedError

    def fallback(self, chunk: Chunk, reason: str) -> ChunkDecision:
        """Keep the window's first k batches (stream order)."""
        k = keep_count(chunk.size, self.cfg.L, self.cfg.fraction)
        scores = -np.arange(chunk.size * chunk.batch_size, dtype=np.float64)
        return _with_fallback(top_k_decision(scores, k, chunk.batch_size, {"scheduler": self.name}), reason)



class RandomSelectHead(SelectHead):
    """Every chunk keeps a seeded uniform random subset (the selection baseline)."""

    def is_scored(self, chunk_id: int) -> bool:
        return False


def _with_fallback(decision: ChunkDecision, reason: str) -> ChunkDecision:
    record = {**decision.record, "fallback_reason": reason, "fallback_selection": "first_batches"}
    return ChunkDecision(order=decision.order, selection=decision.selection, skipped=decision.skipped,
                         fallback=True, record=record)


@dataclass
class ScoredPending:
    head: SelectHead
    chunk: Chunk
    k_batches: int
    scores: Any
    started: float

    def result(self, timeout_s: float | None) -> ChunkDecision:
        # ValueError: scores top_k_decision cannot rank (the scorer's own check)
        return result_by_deadline(self._decide, partial(self.head.fallback, self.chunk), timeout_s,
                                  also=(ValueError,))

    def _decide(self, deadline: Deadline) -> ChunkDecision:
        scores = deadline.get(self.scores) if is_object_ref(self.scores) else self.scores
        record = {"scheduler": self.head.name, "selected_by": "score", "score_sec": time.perf_counter() - self.started}
        return top_k_decision(scores, self.k_batches, self.chunk.batch_size, record)
