"""A select or weight scheduler followed by an order scheduler: one scheduler to the coordinator.

    chunk (window of candidate batches) ──► head.submit ──► selection, weights     (model work on actors)
        │ the kept sequences regrouped into batches, put in the object store once
        ▼
    order.submit(kept batches) ──► order                  (D3 sketches the *kept* batches)
        ▼
    ChunkDecision(selection, weights, order)

The second stage starts as soon as the head's decision exists (a thread per chunk in the
coordinator's process), so both run ahead of the trainers. Past the deadline the decision falls back
stage by stage: the head's fallback (its own rule, e.g. keep the window's first L batches), then the
kept batches in stream order.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any, Protocol

from d3ray.data.chunker import Chunk
from d3ray.schedule.scheduler import (
    ChunkDecision,
    ChunkFeedback,
    PendingDecision,
    Scheduler,
    SubmitContext,
)


class Head(Scheduler, Protocol):
    """The first stage: a Scheduler whose decision selects or weights (its ``order`` is ignored)."""

    def fallback(self, chunk: Chunk, reason: str) -> ChunkDecision: ...


class StagedScheduler:
    """``head`` decides what trains, ``order`` orders it (see the module docstring)."""

    def __init__(self, head: Head, order: Scheduler, batch_size: int) -> None:
        self.head = head
        self.order = order
        self.batch_size = batch_size

    def submit(self, chunk: Chunk, batch_refs: tuple, context: SubmitContext) -> PendingDecision:
        return StagedPending(self, chunk, batch_refs, context)

    def observe(self, feedback: ChunkFeedback) -> None:
        self.head.observe(feedback)
        self.order.observe(feedback)

    def mixture(self, chunk_id: int) -> dict[str, float] | None:
        return None  # a selector or weighter does not mix (d3ray/schedule/README.md, combinations)

    def state_dict(self) -> dict[str, Any]:
        return {"head": self.head.state_dict(), "order": self.order.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.head.load_state_dict(state.get("head", {}))
        self.order.load_state_dict(state.get("order", {}))

    def actors(self) -> dict[str, list[Any]]:
        return {**self.head.actors(), **self.order.actors()}

    def close(self) -> None:
        self.head.close()
        self.order.close()


def kept_chunk(chunk: Chunk, head: ChunkDecision) -> tuple[Chunk, tuple]:
    """The chunk of the batches ``head`` keeps, and their object refs (put once here)."""
    import ray

    if head.selection is None:
        raise ValueError("kept_chunk needs a selection")
    batches = tuple(chunk.gather(sel) for sel in head.selection)
    refs = tuple(ray.put(b) for b in batches)
    return dataclasses.replace(chunk, batches=batches), refs


class StagedPending:
    """The two stages of one chunk in flight."""

    def __init__(self, staged: StagedScheduler, chunk: Chunk, batch_refs: tuple, context: SubmitContext) -> None:
        self._staged = staged
        self._chunk = chunk
        self._done = threading.Event()
        self._head: ChunkDecision | None = None
        self._decision: ChunkDecision | None = None
        self._error: BaseException | None = None
        first = staged.head.submit(chunk, batch_refs, context)
        self._thread = threading.Thread(target=self._run, args=(first, batch_refs, context), daemon=True,
                                        name=f"staged-{chunk.chunk_id}")
        self._thread.start()

    def _run(self, first: PendingDecision, batch_refs: tuple, context: SubmitContext) -> None:
        try:
            head = first.result(None)
            self._head = head
            if head.selection is None:
                sub, refs = self._chunk, batch_refs
            else:
                sub, refs = kept_chunk(self._chunk, head)
            second = self._staged.order.submit(sub, refs, context).result(None)
            self._decision = merge(head, second, refs if head.selection is not None else None)
        except BaseException as err:  # surfaced as the fallback's reason in result()
            self._error = err
        finally:
            self._done.set()

    def result(self, timeout_s: float | None) -> ChunkDecision:
        start = time.monotonic()
        self._done.wait(timeout_s)
        if self._decision is not None:
            return self._decision
        reason = (f"{type(self._error).__name__}: {self._error}" if self._error is not None
                  else f"deadline of {timeout_s:.0f}s passed")
        head = self._head or self._staged.head.fallback(self._chunk, reason)
        n = len(head.selection) if head.selection is not None else self._chunk.size
        stream = ChunkDecision(order=tuple(range(n)), fallback=True,
                               record={"fallback_reason": reason, "fallback_order": "stream",
                                       "fallback_wait_sec": time.monotonic() - start})
        return merge(head, stream, None)


def merge(head: ChunkDecision, order: ChunkDecision, refs: tuple | None) -> ChunkDecision:
    """The head's selection and weights with the order stage's order (records merged, head first).

    An order stage that re-batches (curricula, mtl: its own ``selection`` over the kept sequences)
    is composed with the head's: the kept batches are regrouped, their weights follow them.
    """
    record = {**order.record, "order_scheduler": order.record.get("scheduler"), **head.record}
    selection, weights = head.selection, head.sample_weights
    if order.selection is not None:
        n_kept = sum(len(b) for b in order.selection)
        flat = [j for b in head.selection for j in b] if head.selection is not None else list(range(n_kept))
        flat_w = [w for b in weights for w in b] if weights is not None else None
        selection = tuple(tuple(flat[k] for k in b) for b in order.selection)
        weights = None if flat_w is None else tuple(tuple(flat_w[k] for k in b) for b in order.selection)
        refs = None
    return ChunkDecision(
        order=order.order, selection=selection, sample_weights=weights,
        loss_weighting=head.loss_weighting, skipped=dict(head.skipped), fallback=head.fallback or order.fallback,
        record=record, matrix=order.matrix, batch_refs=refs,
    )
