"""ScheduleCoordinator: one actor per run that turns the data stream into decided chunks.

    Ray Data stream ──► ChunkStream (B-sequence batches, chunks of the scheduler's window)
        │  each batch ray.put once; only references travel from here on
        ▼
    Scheduler.submit(chunk, refs, SubmitContext)   at most ``prefetch_chunks`` chunks ahead
        │  needs.weights:  the snapshot of version c − staleness (published by the trainers)
        │  needs.sketches: the trainers sketch chunk c at version c − staleness, and send its S
        │                  (they fetch its batches with ``sketch_request(c)``, answer ``publish_influence``)
        │  needs.feedback: observe() the trainers' per-sample losses of every chunk < c − staleness first
        ▼
    get_chunk(chunk_id) ──► DecidedChunk(batches in training order, weights, skipped) ──► every rank

It is a threaded actor: trainer ranks block in ``get_chunk`` while a producer thread reads, batches
and submits the chunks ahead. Chunks are keyed by ``chunk_id``, so a trainer that restarts from a
checkpoint asks for the chunk after its cursor: if that chunk has already been released, the stream
restarts at the newest data cursor known at or before that chunk (``Chunk.cursor`` of every chunk it
produced, or the one a checkpoint restored), seeking in the shards instead of re-reading them, and
skips forward only from there. A checkpoint carries ``checkpoint_state``: the decision of the next
chunk, the scheduler's state after the feedback of every trained chunk and the data cursor of the
next chunk, so that a resumed run (even with a new coordinator) decides exactly as an uninterrupted
one and starts reading where it stopped.

A mixer (``needs.mixture``) decides the stream itself: the coordinator builds the stream with
``make_stream(cursor=..., mixture_for_chunk=...)``, and before chunk c is drawn the callback makes the
scheduler observe the feedback of every chunk < c − staleness (the rule ``submit`` follows) and returns
``scheduler.mixture(c)``; the chunk's mixture travels with it (``DecidedChunk.mixture``, schedule log).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from d3ray.data.chunker import Chunk, ChunkStream
from d3ray.errors import UserError
from d3ray.schedule.scheduler import (
    ChunkDecision,
    ChunkFeedback,
    LossWeighting,
    Needs,
    PendingDecision,
    Scheduler,
    SubmitContext,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DecidedChunk:
    """What a trainer receives for one chunk: its batches in training order.

    Attributes:
        chunk_id: run-wide chunk id.
        epoch: data epoch of the chunk.
        batch_refs: per training position, the ObjectRef of its ``GlobalBatch``.
        sample_ids: per training position, the B sample ids (exactly-once accounting).
        domains: per training position, the B domain labels.
        sample_weights: per training position, the B loss weights; None = 1.
        loss_weighting: the in-step weighting rule, or None.
        skipped: reason → sample ids of the chunk that do not train.
        decision: the scheduler's decision (``record`` and ``order`` go to the schedule log).
        weights_version: chunks trained before the weights the scheduler used (None if unused).
        mixture: the domain weights the chunk was drawn with (mixers), None for a plain stream.
    """

    chunk_id: int
    epoch: int
    batch_refs: tuple[Any, ...]
    sample_ids: tuple[tuple[str, ...], ...]
    domains: tuple[tuple[str, ...], ...]
    sample_weights: tuple[tuple[float, ...], ...] | None
    loss_weighting: LossWeighting | None
    skipped: dict[str, tuple[str, ...]]
    decision: ChunkDecision
    weights_version: int | None = None
    mixture: dict[str, float] | None = None

    @property
    def steps(self) -> int:
        return len(self.batch_refs)


@dataclass
class _Slot:
    chunk: Chunk
    refs: tuple[Any, ...]
    pending: PendingDecision | None
    weights_version: int | None
    served: DecidedChunk | None = None


@dataclass
class CoordinatorState:
    """Counters exposed to the driver and the tests."""

    chunks_produced: int = 0
    stream_restarts: int = 0
    restarts_from_cursor: int = 0
    chunks_skipped_on_seek: int = 0
    feedback_chunks: int = 0
    served: dict[int, int] = field(default_factory=dict)


class ScheduleCoordinator:
    """Produces decided chunks ahead of the trainers (plain class; wrapped by ``ray.remote`` at creation).

    Args:
        make_stream: ``make_stream(cursor=...)`` gives a fresh, deterministic :class:`ChunkStream` that
            starts at ``cursor`` (a ``Chunk.cursor``), or at chunk 0 when it is None; for a mixer
            (``needs.mixture``) it is called with ``mixture_for_chunk=`` too (the stream draws by domain).
        scheduler: decides each chunk.
        needs: what the scheduler needs (its config's ``needs()``).
        prefetch_chunks: chunks produced ahead of the highest requested chunk id.
        staleness: chunk c uses weights version c − staleness and the feedback of chunks < c − staleness.
        deadline_s: how long ``get_chunk`` waits for a decision before using the fallback.
        run_dir: the run directory (this actor logs to ``<run_dir>/logs/coordinator.log``).
    """

    def __init__(
        self,
        make_stream: Callable[..., ChunkStream],
        scheduler: Scheduler,
        needs: Needs,
        prefetch_chunks: int = 2,
        staleness: int = 1,
        deadline_s: float | None = None,
        run_dir: str | None = None,
    ) -> None:
        if run_dir is not None:
            from d3ray.run_files import route_logs_to_run_dir

            route_logs_to_run_dir(run_dir, "coordinator")
        self._make_stream = make_stream
        self._scheduler = scheduler
        self._needs = needs
        self._prefetch = prefetch_chunks
        self._staleness = staleness
        self._deadline_s = deadline_s
        self._cond = threading.Condition()
        self._observe_lock = threading.Lock()
        self._slots: dict[int, _Slot] = {}
        self._decided: dict[int, ChunkDecision] = {}
        self._weights: dict[int, list] = {}
        self._influence: dict[int, list] = {}  # chunk_id -> [ObjectRef of the trainers' ChunkInfluence]
        self._candidates: dict[int, tuple[tuple, list[int]]] = {}  # chunk_id -> (batch refs, batch ids) to sketch
        self._snapshot_records: dict[int, dict[str, Any]] = {}  # weights version -> its schedule-log fields
        self._feedback: dict[int, ChunkFeedback] = {}
        self._observed_through = -1
        self._cursors: dict[int, dict[str, Any]] = {}  # chunk_id -> data cursor at its start
        self._decided_versions: dict[int, int | None] = {}  # chunk_id -> weights version of its decision
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
    def get_chunk(self, chunk_id: int) -> DecidedChunk:
        """Block until chunk ``chunk_id`` is produced and decided; its batches in training order."""
        with self._cond:
            if chunk_id < self._next_id and chunk_id not in self._slots:
                self._seek_to = chunk_id if self._seek_to is None else min(self._seek_to, chunk_id)
            self._wanted = max(self._wanted, chunk_id + self._prefetch)
            self._cond.notify_all()
            while chunk_id not in self._slots and self._error is None:
                self._cond.wait(timeout=1.0)
            if self._error is not None:
                err = self._error
                if isinstance(err, UserError):
                    raise err
                raise RuntimeError(
                    f"schedule coordinator failed while producing chunk {chunk_id}: {type(err).__name__}: {err}"
                ) from err
            slot = self._slots[chunk_id]
        served = slot.served or self._serve(slot)
        with self._cond:
            slot.served = served
            self.state.served[chunk_id] = self.state.served.get(chunk_id, 0) + 1
        return served

    def feedback(self, feedback: ChunkFeedback) -> None:
        """Per-sample losses of one trained chunk (trainer rank 0, once per chunk; repeats are ignored)."""
        with self._cond:
            if feedback.chunk_id > self._observed_through and feedback.chunk_id not in self._feedback:
                self._feedback[feedback.chunk_id] = feedback
                self.state.feedback_chunks += 1
            self._cond.notify_all()

    def sketch_request(self, chunk_id: int) -> tuple[tuple, list[int]] | None:
        """The batches (refs, global batch ids) of chunk ``chunk_id`` for the trainers to sketch
        (``needs.sketches``); waits until the chunk is produced. None when it needs no sketches any
        more: decided (e.g. restored from a checkpoint) or already sketched (trainers that rolled back)."""
        with self._cond:
            self._wanted = max(self._wanted, chunk_id)
            self._cond.notify_all()
            while True:
                if chunk_id in self._decided or chunk_id in self._influence:
                    return None
                if chunk_id in self._candidates:
                    return self._candidates[chunk_id]
                if self._error is not None:
                    raise RuntimeError(f"schedule coordinator failed: {type(self._error).__name__}: {self._error}")
                self._cond.wait(timeout=1.0)

    def publish_influence(self, chunk_id: int, influence: list) -> None:
        """The trainers' influence of chunk ``chunk_id`` (``[ObjectRef of ChunkInfluence]``, trainer rank 0)."""
        with self._cond:
            self._influence.setdefault(chunk_id, influence)
            self._cond.notify_all()

    def release(self, before_chunk_id: int) -> None:
        """Drop chunks with id < ``before_chunk_id`` (they are covered by a checkpoint)."""
        with self._cond:
            for cid in [c for c in self._slots if c < before_chunk_id]:
                del self._slots[cid]
            for cid in [c for c in self._decided if c < before_chunk_id]:
                del self._decided[cid]
                self._decided_versions.pop(cid, None)
            for v in [v for v in self._weights if v < before_chunk_id - self._staleness - 1]:
                del self._weights[v]
            for cid in [c for c in self._cursors if c < before_chunk_id]:
                del self._cursors[cid]
            for table in (self._influence, self._candidates):
                for cid in [c for c in table if c < before_chunk_id]:
                    del table[cid]
            self._cond.notify_all()

    def publish_weights(self, version: int, weights: list, nbytes: int | None = None, dtype: str | None = None) -> None:
        """Weights after ``version`` trained chunks (``weights`` = [ObjectRef of a state dict, and of the
        AdamWState if shipped]); ``nbytes`` and ``dtype`` (their payload and the dtype they travel in)
        go into the schedule-log row of every chunk decided at this version (``snapshot_bytes``,
        ``snapshot_dtype``)."""
        with self._cond:
            self._weights[version] = weights
            self._snapshot_records.pop(version, None)
            if nbytes is not None:
                self._snapshot_records[version] = {"snapshot_bytes": int(nbytes), "snapshot_dtype": dtype}
            for v in [v for v in self._snapshot_records if v not in self._weights]:  # released with their weights
                del self._snapshot_records[v]
            self._cond.notify_all()

    def _with_snapshot_record(self, decision: ChunkDecision, version: int | None) -> ChunkDecision:
        """The decision with the size and dtype of the snapshot it was decided at in its ``record`` (a
        copy: the stored decision stays as the scheduler made it); unchanged when that is unknown (no
        weights used, or a decision restored from a checkpoint of an earlier coordinator)."""
        with self._cond:
            fields = self._snapshot_records.get(version) if version is not None else None
        if not fields:
            return decision
        return replace(decision, record={**decision.record, **fields})

    def checkpoint_state(self, next_chunk: int) -> dict[str, Any]:
        """What a checkpoint at ``next_chunk`` must hold for the resumed run to decide as this one:
        the decisions of the chunks from ``next_chunk`` on that are already decided, and the
        scheduler's state after observing the feedback of every chunk < ``next_chunk``."""
        with self._cond:
            decisions = {str(c): d.to_state() for c, d in sorted(self._decided.items()) if c >= next_chunk}
            versions = {c: self._decided_versions.get(int(c)) for c in decisions}
            cursor = self._cursors.get(next_chunk)
        state: dict[str, Any] = {"decisions": decisions, "weights_versions": versions,
                                 "observed_through": self._observed_through}
        if cursor is not None:
            state["data_cursor"] = {"chunk_id": next_chunk, "cursor": cursor}
        if self._needs.feedback:
            self._observe_through(next_chunk - 1)
            with self._observe_lock:
                state["scheduler"] = self._scheduler.state_dict()
                state["observed_through"] = self._observed_through
        return state

    def restore(self, state: dict[str, Any]) -> None:
        """Load a checkpoint's ``checkpoint_state`` (a live coordinator keeps what it already knows)."""
        with self._cond:
            versions = state.get("weights_versions", {})
            for cid, decision in state.get("decisions", {}).items():
                self._decided.setdefault(int(cid), ChunkDecision.from_state(decision))
                self._decided_versions.setdefault(int(cid), versions.get(cid))
            if "data_cursor" in state:
                cid = int(state["data_cursor"]["chunk_id"])
                self._cursors.setdefault(cid, state["data_cursor"]["cursor"])
                if cid > self._next_id and cid not in self._slots and self._seek_to is None:
                    # A resumed run: jump the stream to the checkpoint's cursor instead of reading
                    # every chunk before it (the chunks before are trained already).
                    self._seek_to = cid
                    self._wanted = max(self._wanted, cid + self._prefetch - 1)
                    self._cond.notify_all()
        with self._observe_lock:
            through = int(state.get("observed_through", -1))
            if "branch_at" in state and "scheduler" not in state:
                # A compare arm branching from a shared trunk (d3ray/compare/trunk.py): its scheduler
                # starts fresh at that chunk and sees no feedback of the trunk's chunks.
                with self._cond:
                    self._observed_through = max(self._observed_through, int(state["branch_at"]) - 1)
                    self._cond.notify_all()
            elif "scheduler" in state and through > self._observed_through:
                self._scheduler.load_state_dict(state["scheduler"])
                with self._cond:
                    self._observed_through = through
                    for cid in [c for c in self._feedback if c <= through]:
                        del self._feedback[cid]
                    self._cond.notify_all()

    def error(self) -> BaseException | None:
        """The exception that stopped the chunk producer, if any (the driver re-raises a user error)."""
        with self._cond:
            return self._error

    def report(self) -> dict[str, Any]:
        """Counters of the coordinator and the chunk stream, plus the data-quality ledger if any."""
        with self._cond:
            stream = self._stream
            out: dict[str, Any] = {
                "chunks_produced": self.state.chunks_produced,
                "stream_restarts": self.state.stream_restarts,
                "restarts_from_cursor": self.state.restarts_from_cursor,
                "chunks_skipped_on_seek": self.state.chunks_skipped_on_seek,
                "feedback_chunks": self.state.feedback_chunks,
                "served": dict(self.state.served),
            }
        if stream is not None:
            out["dropped_tail_sequences"] = stream.stats.dropped_tail_sequences
            out["per_epoch_chunks"] = list(stream.stats.per_epoch_chunks)
            if stream.stats.domain_draws:
                out["domain_draws"] = dict(stream.stats.domain_draws)
                out["domain_epochs"] = dict(stream.stats.domain_epochs)
            ledger = getattr(stream, "ledger", None)
            if ledger is not None:
                out["data_quality"] = {**ledger.to_dict(), "bad_by_reason": ledger.bad_by_reason()}
        return out

    # ---- deciding -------------------------------------------------------------------------
    def _serve(self, slot: _Slot) -> DecidedChunk:
        import ray

        chunk = slot.chunk
        cid = chunk.chunk_id
        with self._cond:
            decision = self._decided.get(cid)
        if decision is None:
            assert slot.pending is not None
            decision = slot.pending.result(self._deadline_s)
            with self._cond:
                decision = self._decided.setdefault(cid, decision)
                self._decided_versions.setdefault(cid, slot.weights_version)
        if decision.selection is None:
            batch_refs = tuple(slot.refs[i] for i in decision.order)
            ids = tuple(chunk.batches[i].sample_ids for i in decision.order)
            domains = tuple(chunk.batches[i].domains for i in decision.order)
            trained = {s for batch in chunk.batches for s in batch.sample_ids}
        else:
            refs = decision.batch_refs or tuple(ray.put(chunk.gather(sel)) for sel in decision.selection)
            batch_refs = tuple(refs[i] for i in decision.order)
            B = chunk.batch_size
            flat_ids = [s for batch in chunk.batches for s in batch.sample_ids]
            flat_domains = [d for batch in chunk.batches for d in batch.domains]
            ids = tuple(tuple(flat_ids[j] for j in decision.selection[i]) for i in decision.order)
            domains = tuple(tuple(flat_domains[j] for j in decision.selection[i]) for i in decision.order)
            trained = {s for batch in ids for s in batch}
            assert all(len(b) == B for b in ids), "every trained batch holds B sequences"
        skipped = {reason: tuple(chunk.gather(idx).sample_ids) if idx else ()
                   for reason, idx in decision.skipped.items()}
        _check_accounting(chunk, trained, skipped)
        weights = None
        if decision.sample_weights is not None:
            weights = tuple(tuple(decision.sample_weights[i]) for i in decision.order)
        version = self._decided_versions.get(cid)
        return DecidedChunk(chunk_id=cid, epoch=chunk.epoch, batch_refs=batch_refs, sample_ids=ids,
                            domains=domains, sample_weights=weights, loss_weighting=decision.loss_weighting,
                            skipped=skipped, decision=self._with_snapshot_record(decision, version),
                            weights_version=version, mixture=chunk.mixture)

    def _observe_through(self, chunk_id: int, producer: bool = False) -> None:
        """Feed the scheduler the feedback of every chunk <= ``chunk_id``, in chunk order (waits for it).

        Waiting holds no lock but the condition's, so that a ``restore`` (which may move the scheduler
        past the awaited chunks) can always get in; observing holds the observe lock, as ``submit`` does.
        In the ``producer`` thread, a seek request ends the wait (:class:`_Reseek`).
        """
        while True:
            with self._cond:
                while self._observed_through < chunk_id and self._observed_through + 1 not in self._feedback:
                    if producer and self._seek_to is not None:
                        raise _Reseek
                    if self._error is not None:  # the producer stopped (it may have held the awaited feedback)
                        raise RuntimeError(f"schedule coordinator failed: {type(self._error).__name__}: {self._error}")
                    self._cond.wait(timeout=1.0)
                if self._observed_through >= chunk_id:
                    return
                nxt = self._observed_through + 1
            with self._observe_lock:
                with self._cond:
                    if self._observed_through + 1 != nxt or nxt not in self._feedback:
                        continue  # observed meanwhile, or a restore moved past it
                    feedback = self._feedback.pop(nxt)
                self._scheduler.observe(feedback)
                with self._cond:
                    self._observed_through = nxt
                    self._cond.notify_all()

    def _mixture_for_chunk(self, chunk_id: int) -> dict[str, float]:
        """The mixture chunk ``chunk_id`` is drawn with (the stream calls it just before drawing it):
        the scheduler first observes the feedback of every chunk < chunk_id − staleness, as for ``submit``."""
        if self._needs.feedback:
            self._observe_through(chunk_id - self._staleness - 1, producer=True)
        with self._observe_lock:
            mixture = self._scheduler.mixture(chunk_id)
        if mixture is None:
            raise RuntimeError(f"the scheduler declares needs.mixture but mixture({chunk_id}) returned None")
        return mixture

    # ---- producer -------------------------------------------------------------------------
    def _new_stream(self, cursor: dict[str, Any] | None) -> ChunkStream:
        if self._needs.mixture:
            return self._make_stream(cursor=cursor, mixture_for_chunk=self._mixture_for_chunk)
        return self._make_stream(cursor=cursor)

    def _produce_forever(self) -> None:
        try:
            while True:
                with self._cond:
                    while self._seek_to is None and self._next_id > self._wanted:
                        self._cond.wait()
                    seek = self._seek_to
                    self._seek_to = None
                try:
                    if seek is not None:
                        self._restart_stream(seek)
                    self._produce_one()
                except _Reseek:
                    # Trainers restarted from a checkpoint ask for an earlier chunk while this one waited
                    # for weights or feedback they will only produce after it: drop it and seek.
                    logger.info("chunk producer: a trainer asked for an earlier chunk; seeking back")
        except BaseException as err:  # surfaced to every waiting trainer by get_chunk
            if isinstance(err, UserError):
                logger.error("chunk producer stopped: %s", err)
            else:
                logger.exception("chunk producer failed")
            with self._cond:
                self._error = err
                self._cond.notify_all()

    def _restart_stream(self, target: int) -> None:
        with self._cond:
            known = [c for c in self._cursors if c <= target]
            start = max(known) if known else None
            cursor = self._cursors[start] if start is not None else None
        if cursor is None:
            logger.info("re-reading the data stream from chunk 0 to reach chunk %d (no data cursor)", target)
        else:
            logger.info("restarting the data stream at the cursor of chunk %d to reach chunk %d", start, target)
            self.state.restarts_from_cursor += 1
        if self._stream is not None:
            self._stream.close()
        self._stream = self._new_stream(cursor)
        self._iter = iter(self._stream)
        self.state.stream_restarts += 1
        next_id = start or 0
        while next_id < target:
            next(self._iter)
            next_id += 1
            self.state.chunks_skipped_on_seek += 1
        with self._cond:
            self._next_id = target

    def _produce_one(self) -> None:
        import ray

        if self._iter is None:
            self._stream = self._new_stream(None)
            self._iter = iter(self._stream)
        chunk = next(self._iter)
        assert chunk.chunk_id == self._next_id, (chunk.chunk_id, self._next_id)
        if chunk.cursor is not None:
            with self._cond:
                self._cursors[chunk.chunk_id] = chunk.cursor
        refs = tuple(ray.put(batch) for batch in chunk.batches)
        pending, version = None, None
        with self._cond:
            decided = chunk.chunk_id in self._decided
        if not decided:
            context = SubmitContext()
            if self._needs.feedback:
                self._observe_through(chunk.chunk_id - self._staleness - 1, producer=True)
            if self._needs.weights:
                version, weights = self._wait_for_weights(chunk.chunk_id - self._staleness)
                context = SubmitContext(weights=weights, weights_version=version)
            elif self._needs.sketches:
                with self._cond:
                    self._candidates[chunk.chunk_id] = (refs, list(chunk.batch_ids))
                    self._cond.notify_all()
                version = max(0, chunk.chunk_id - self._staleness)
                context = SubmitContext(influence=self._wait_for_influence(chunk.chunk_id), weights_version=version)
            with self._observe_lock:
                pending = self._scheduler.submit(chunk, refs, context)
        with self._cond:
            self._slots[chunk.chunk_id] = _Slot(chunk, refs, pending, version)
            self._next_id = chunk.chunk_id + 1
            self.state.chunks_produced += 1
            self._cond.notify_all()

    def _wait_for_weights(self, version: int) -> tuple[int | None, list | None]:
        """The snapshot of ``version`` (waits for it). A resumed run that lacks it takes the oldest
        newer one; past the deadline, the newest there is (None if none)."""
        version = max(0, version)
        start = time.monotonic()
        with self._cond:
            while True:
                if version in self._weights:
                    return version, self._weights[version]
                newer = [v for v in self._weights if v > version]
                if newer:
                    return min(newer), self._weights[min(newer)]
                if self._deadline_s is not None and time.monotonic() - start > self._deadline_s:
                    newest = max(self._weights) if self._weights else None
                    return newest, (self._weights[newest] if newest is not None else None)
                if self._seek_to is not None:  # rolled-back trainers will publish it only after an earlier chunk
                    raise _Reseek
                self._cond.wait(timeout=0.5)

    def _wait_for_influence(self, chunk_id: int) -> list | None:
        """The trainers' influence of ``chunk_id`` (waits for it); None past the deadline (the
        scheduler then falls back)."""
        start = time.monotonic()
        with self._cond:
            while chunk_id not in self._influence:
                if self._deadline_s is not None and time.monotonic() - start > self._deadline_s:
                    return None
                if self._seek_to is not None:  # rolled-back trainers sketch it only after an earlier chunk
                    raise _Reseek
                self._cond.wait(timeout=0.5)
            return self._influence[chunk_id]


class _Reseek(Exception):
    """Raised in the producer thread when a seek request ends a wait (see ``_produce_forever``)."""


def _check_accounting(chunk: Chunk, trained: set[str], skipped: dict[str, tuple[str, ...]]) -> None:
    """Every candidate of the chunk trains or is skipped with a reason, exactly once."""
    produced = [s for batch in chunk.batches for s in batch.sample_ids]
    accounted = sorted(list(trained) + [s for ids in skipped.values() for s in ids])
    if accounted != sorted(produced):
        raise RuntimeError(f"chunk {chunk.chunk_id}: the decision does not account for every sample exactly once")
