"""ScheduleCoordinator: one actor per run that turns the data stream into ordered chunks.

    Ray Data stream ──► ChunkStream (B-sequence batches, L-batch chunks)
        │  each batch ray.put once; only references travel from here on
        ▼
    Scheduler.submit(chunk, weights)   ── random / sequential: at once; D3: influence + solver pools
        │  bounded: at most ``prefetch_chunks`` chunks ahead of the newest request
        ▼
    get_chunk(chunk_id) ──► OrderedChunk(order, batch refs, sample ids)  ──► every trainer rank

It is a threaded actor: trainer ranks block in ``get_chunk`` while a producer thread reads,
batches and schedules the chunks ahead. Chunks are keyed by ``chunk_id``, so a trainer that
restarts from a checkpoint simply asks for the chunk after its cursor: if that chunk has already
been released, the stream is re-read deterministically and skipped forward to it. Orders already
decided (restored from a checkpoint with ``restore_decisions``) are reused, not recomputed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from d3ray.schedule.chunker import Chunk, ChunkStream
from d3ray.schedule.scheduler import ChunkDecision, PendingOrder, Scheduler

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class OrderedChunk:
    """What a trainer receives for one chunk.

    Attributes:
        chunk_id: run-wide chunk id.
        epoch: data epoch of the chunk.
        order: positions into ``batch_refs`` in training order.
        batch_refs: one ObjectRef per batch (a ``GlobalBatch``), in chunk position order.
        sample_ids: per batch position, the B sample ids (for exactly-once accounting).
        domains: per batch position, the B domain labels.
        decision: the scheduler's decision (``record`` goes to the schedule log).
        weights_version: chunks trained before the weights the scheduler used (None if unused).
    """

    chunk_id: int
    epoch: int
    order: tuple[int, ...]
    batch_refs: tuple[Any, ...]
    sample_ids: tuple[tuple[str, ...], ...]
    domains: tuple[tuple[str, ...], ...]
    decision: ChunkDecision
    weights_version: int | None = None


@dataclass
class _Slot:
    chunk: Chunk
    refs: tuple[Any, ...]
    pending: PendingOrder | None
    weights_version: int | None
    decision: ChunkDecision | None = None


@dataclass
class CoordinatorState:
    """Counters exposed to the driver and the tests."""

    chunks_produced: int = 0
    stream_restarts: int = 0
    chunks_skipped_on_seek: int = 0
    served: dict[int, int] = field(default_factory=dict)


class ScheduleCoordinator:
    """Produces ordered chunks ahead of the trainers (plain class; wrapped by ``ray.remote`` at creation).

    Args:
        make_stream: zero-argument factory of a fresh, deterministic :class:`ChunkStream`.
        scheduler: orders each chunk.
        prefetch_chunks: chunks produced ahead of the highest requested chunk id.
        staleness: weights for chunk c must be at least version ``c - staleness`` (number of chunks
            trained); only used when ``scheduler.needs_weights``.
        deadline_s: how long ``get_chunk`` waits for a decision before using the fallback order.
    """

    def __init__(
        self,
        make_stream: Callable[[], ChunkStream],
        scheduler: Scheduler,
        prefetch_chunks: int = 2,
        staleness: int = 1,
        deadline_s: float | None = None,
    ) -> None:
        self._make_stream = make_stream
        self._scheduler = scheduler
        self._prefetch = prefetch_chunks
        self._staleness = staleness
        self._deadline_s = deadline_s
        self._needs_weights = bool(getattr(scheduler, "needs_weights", False))
        self._cond = threading.Condition()
        self._slots: dict[int, _Slot] = {}
        self._decided: dict[int, tuple[int, ...]] = {}
        self._weights: dict[int, list] = {}
        self._stream: ChunkStream | None = None
        self._iter: Iterator[Chunk] | None = None
        self._next_id = 0
        self._wanted = prefetch_chunks - 1  # start streaming at once, while the trainers start up
        self._seek_to: int | None = None
        self._error: BaseException | None = None
        self.state = CoordinatorState()
        self._thread = threading.Thread(target=self._produce_forever, name="chunk-producer", daemon=True)
        self._thread.start()

    # ---- trainer-facing -------------------------------------------------------------------
    def get_chunk(self, chunk_id: int) -> OrderedChunk:
        """Block until chunk ``chunk_id`` is produced, then return it in its decided order."""
        with self._cond:
            if chunk_id < self._next_id and chunk_id not in self._slots:
                self._seek_to = chunk_id if self._seek_to is None else min(self._seek_to, chunk_id)
            self._wanted = max(self._wanted, chunk_id + self._prefetch)
            self._cond.notify_all()
            while chunk_id not in self._slots and self._error is None:
                self._cond.wait(timeout=1.0)
            if self._error is not None:
                err = self._error
                raise RuntimeError(
                    f"schedule coordinator failed while producing chunk {chunk_id}: {type(err).__name__}: {err}"
                ) from err
            slot = self._slots[chunk_id]
        decision = self._decide(slot)
        with self._cond:
            self.state.served[chunk_id] = self.state.served.get(chunk_id, 0) + 1
        chunk = slot.chunk
        return OrderedChunk(
            chunk_id=chunk.chunk_id,
            epoch=chunk.epoch,
            order=decision.order,
            batch_refs=slot.refs,
            sample_ids=tuple(b.sample_ids for b in chunk.batches),
            domains=tuple(b.domains for b in chunk.batches),
            decision=decision,
            weights_version=slot.weights_version,
        )

    def release(self, before_chunk_id: int) -> None:
        """Drop chunks with id < ``before_chunk_id`` (they are covered by a checkpoint)."""
        with self._cond:
            for cid in [c for c in self._slots if c < before_chunk_id]:
                del self._slots[cid]
            for v in [v for v in self._weights if v < before_chunk_id - self._staleness - 1]:
                del self._weights[v]
            self._cond.notify_all()

    def publish_weights(self, version: int, weights: list) -> None:
        """Weights after ``version`` trained chunks (``weights`` = [ObjectRef of a numpy state dict])."""
        with self._cond:
            self._weights[version] = weights
            self._cond.notify_all()

    def restore_decisions(self, orders: dict[int, list[int]]) -> None:
        """Orders already decided (from a checkpoint's schedule log): reuse them on resume."""
        with self._cond:
            self._decided.update({int(k): tuple(int(i) for i in v) for k, v in orders.items()})

    def report(self) -> dict[str, Any]:
        """Counters of the coordinator and the chunk stream, plus the data-quality ledger if any."""
        with self._cond:
            stream = self._stream
            out: dict[str, Any] = {
                "chunks_produced": self.state.chunks_produced,
                "stream_restarts": self.state.stream_restarts,
                "chunks_skipped_on_seek": self.state.chunks_skipped_on_seek,
                "served": dict(self.state.served),
            }
        if stream is not None:
            out["dropped_tail_sequences"] = stream.stats.dropped_tail_sequences
            out["per_epoch_chunks"] = list(stream.stats.per_epoch_chunks)
            ledger = getattr(stream, "ledger", None)
            if ledger is not None:
                out["data_quality"] = {**ledger.to_dict(), "bad_by_reason": ledger.bad_by_reason()}
        return out

    def error(self) -> BaseException | None:
        """The exception that stopped the chunk producer, if any (the driver re-raises a user error)."""
        with self._cond:
            return self._error

    # ---- producer -------------------------------------------------------------------------
    def _decide(self, slot: _Slot) -> ChunkDecision:
        cid = slot.chunk.chunk_id
        if slot.decision is not None:
            return slot.decision
        if cid in self._decided:
            decision = ChunkDecision(order=self._decided[cid], record={"reused_from_checkpoint": True})
        else:
            assert slot.pending is not None
            decision = slot.pending.result(self._deadline_s)
        with self._cond:
            slot.decision = decision
            self._decided[cid] = decision.order
        return decision

    def _produce_forever(self) -> None:
        try:
            while True:
                with self._cond:
                    while self._seek_to is None and self._next_id > self._wanted:
                        self._cond.wait()
                    seek = self._seek_to
                    self._seek_to = None
                if seek is not None:
                    self._restart_stream(seek)
                self._produce_one()
        except BaseException as err:  # surfaced to every waiting trainer by get_chunk
            logger.exception("chunk producer failed")
            with self._cond:
                self._error = err
                self._cond.notify_all()

    def _restart_stream(self, target: int) -> None:
        logger.info("re-reading the data stream to reach chunk %d", target)
        self._stream = self._make_stream()
        self._iter = iter(self._stream)
        self.state.stream_restarts += 1
        next_id = 0
        while next_id < target:
            next(self._iter)
            next_id += 1
            self.state.chunks_skipped_on_seek += 1
        with self._cond:
            self._next_id = target

    def _produce_one(self) -> None:
        import ray

        if self._iter is None:
            self._stream = self._make_stream()
            self._iter = iter(self._stream)
        chunk = next(self._iter)
        assert chunk.chunk_id == self._next_id, (chunk.chunk_id, self._next_id)
        refs = tuple(ray.put(batch) for batch in chunk.batches)
        pending, version = None, None
        if chunk.chunk_id not in self._decided:
            weights = None
            if self._needs_weights:
                version, weights = self._wait_for_weights(chunk.chunk_id - self._staleness)
            pending = self._scheduler.submit(chunk, refs, weights)
        with self._cond:
            self._slots[chunk.chunk_id] = _Slot(chunk, refs, pending, version)
            self._next_id = chunk.chunk_id + 1
            self.state.chunks_produced += 1
            self._cond.notify_all()

    def _wait_for_weights(self, min_version: int) -> tuple[int | None, list | None]:
        """Newest published weights of version >= ``min_version`` (waits; None after the deadline)."""
        start = time.monotonic()
        with self._cond:
            while True:
                ready = [v for v in self._weights if v >= max(0, min_version)]
                if ready:
                    v = max(ready)
                    return v, self._weights[v]
                if self._deadline_s is not None and time.monotonic() - start > self._deadline_s:
                    newest = max(self._weights) if self._weights else None
                    return newest, (self._weights[newest] if newest is not None else None)
                self._cond.wait(timeout=0.5)
