"""The coordinator's producer thread: the chunk stream, submitted to the scheduler ahead of the trainers.

    make_stream(cursor=...) ──► ChunkStream ──next──► Chunk c
        │ each batch ray.put once; only references travel from here on
        │ SubmitInputs (what the scheduler waits for, read once from its ``TrainerRequests``):
        │   feedback: observe() the feedback of every chunk < c − staleness first   (mailbox)
        │   weights:  the snapshot of version c − staleness                          (mailbox)
        │   sketch:   offer chunk c to the trainers, wait for their sketch (S)      (mailbox)
        │   mixture:  the stream draws chunk c with scheduler.mixture(c), asked after the same feedback
        ▼
    scheduler.submit(chunk, refs, SubmitContext) ──► slots[c] = Slot(chunk, refs, pending, weights version)

Bounded: the thread produces up to ``prefetch_chunks`` chunks ahead of the highest chunk requested.
Seek: a trainer that restarts from a checkpoint asks for a chunk already released; the stream restarts
at the newest data cursor known at or before it (``Chunk.cursor`` of every chunk produced, or the one
a checkpoint restored) and skips forward from there. A wait for weights, feedback or a sketch that the
rolled-back trainers will only send after an earlier chunk ends with :class:`Reseek`, and the thread
seeks. A chunk whose decision was restored from a checkpoint is produced but not submitted.

Every method that reads or changes the producer's tables is called with the shared condition held
(``self.cond``, the mailbox's), except the thread's own stream handling.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from d3ray.data.chunker import Chunk, ChunkStream
from d3ray.errors import UserError
from d3ray.schedule.coordinator.decide import CoordinatorState, DecidedChunk
from d3ray.schedule.coordinator.mailbox import Mailbox
from d3ray.schedule.scheduler import PendingDecision, Scheduler, SketchRequest, SubmitContext, TrainerRequests

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SubmitInputs:
    """What the producer gathers before it submits a chunk: the coordinator's only reads of the scheduler's
    ``TrainerRequests`` and of ``ScheduleConfig.draws_mixture``."""

    feedback: bool = False
    """Observe the feedback of every chunk < c − staleness before chunk c (and before its mixture)."""
    weights: bool = False
    """Submit chunk c with the weights snapshot of version c − staleness."""
    sketch: SketchRequest | None = None
    """Submit chunk c with the trainers' sketch of it (in-trainer influence), for the chunks it sketches."""
    mixture: bool = False
    """The stream draws chunk c by domain with ``scheduler.mixture(c)``."""

    @classmethod
    def of(cls, requests: TrainerRequests, draws_mixture: bool = False) -> SubmitInputs:
        return cls(feedback=requests.feedback is not None, weights=requests.snapshot is not None,
                   sketch=requests.sketch, mixture=draws_mixture)


@dataclass
class Slot:
    """A produced chunk: its batches' references, the scheduler's pending decision (None: restored)."""

    chunk: Chunk
    refs: tuple[Any, ...]
    pending: PendingDecision | None
    weights_version: int | None
    served: DecidedChunk | None = None


class Reseek(Exception):
    """Raised in the producer thread when a seek request ends a wait (see ``ChunkProducer._run``)."""


class ChunkProducer:
    """The thread that reads, puts and submits chunks ahead of the trainers.

    Args:
        make_stream: ``make_stream(cursor=...)`` (and ``mixture_for_chunk=`` for a mixer) gives a fresh,
            deterministic stream starting at ``cursor`` (chunk 0 when None).
        scheduler: decides each chunk; every call into it holds ``scheduler_lock``.
        scheduler_lock: serialises the calls into the scheduler (submit, observe, mixture, state).
        mailbox: the trainers' inputs; its condition guards the producer's tables too.
        inputs: what to gather before submitting.
        decided: whether a chunk's decision is known already (restored from a checkpoint); called under the condition.
        state: the coordinator's counters.
        prefetch_chunks: chunks produced ahead of the highest requested chunk id.
        staleness: chunk c uses weights version c − staleness and the feedback of chunks < c − staleness.
        deadline_s: how long to wait for weights or a sketch before submitting without them.
    """

    def __init__(self, make_stream: Callable[..., ChunkStream], scheduler: Scheduler, scheduler_lock: threading.Lock,
                 mailbox: Mailbox, inputs: SubmitInputs, decided: Callable[[int], bool], state: CoordinatorState,
                 prefetch_chunks: int, staleness: int, deadline_s: float | None) -> None:
        self._make_stream = make_stream
        self._scheduler = scheduler
        self._scheduler_lock = scheduler_lock
        self._mailbox = mailbox
        self.cond = mailbox.cond
        self._inputs = inputs
        self._decided = decided
        self._state = state
        self._prefetch = prefetch_chunks
        self._staleness = staleness
        self._deadline_s = deadline_s
        self.slots: dict[int, Slot] = {}
        self.cursors: dict[int, dict[str, Any]] = {}  # chunk_id -> data cursor at its start
        self.stream: ChunkStream | None = None
        self._iter: Iterator[Chunk] | None = None
        self.next_id = 0
        self._wanted = prefetch_chunks - 1  # start streaming at once, while the trainers start up
        self._seek_to: int | None = None
        self._trainers_asked = False  # the weights deadline runs only once the trainers wait (they publish version 0)
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="chunk-producer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    # ---- requests (called with the condition held) ------------------------------------------------------
    def request(self, chunk_id: int, through: int | None = None) -> None:
        """A trainer needs ``chunk_id``: seek back if it was released, and produce up to ``prefetch`` past it,
        but not past ``through`` (the run's last chunk as the trainers know it; never below ``chunk_id``).
        Without it a run's last chunks had ``prefetch`` chunks read, tokenized and put past them for nothing
        (15 chunks for 12 trained at L = 8, 6 for 3 at L = 32)."""
        if chunk_id < self.next_id and chunk_id not in self.slots:
            self._seek_to = chunk_id if self._seek_to is None else min(self._seek_to, chunk_id)
        self._trainers_asked = True
        ahead = chunk_id + self._prefetch
        self.want(ahead if through is None else max(chunk_id, min(ahead, through)))

    def want(self, chunk_id: int) -> None:
        """Produce at least up to ``chunk_id``."""
        self._wanted = max(self._wanted, chunk_id)
        self.cond.notify_all()

    def resume_at(self, chunk_id: int) -> None:
        """A resumed run starts at ``chunk_id`` (its cursor is known): jump the stream there instead of
        reading every chunk before it, unless this producer is already past it or seeking."""
        if chunk_id > self.next_id and chunk_id not in self.slots and self._seek_to is None:
            self._seek_to = chunk_id
            self.want(chunk_id + self._prefetch - 1)

    def release(self, before_chunk_id: int) -> None:
        """Drop the slots and cursors of the chunks before ``before_chunk_id``."""
        for table in (self.slots, self.cursors):
            for cid in [c for c in table if c < before_chunk_id]:
                del table[cid]

    def interrupt_for_seek(self) -> None:
        """End a wait of the producer thread when a seek is requested (or the producer failed)."""
        if self._seek_to is not None:
            raise Reseek
        self.raise_if_failed()

    def raise_if_failed(self) -> None:
        """End a wait when the producer stopped (it may have held what the waiter awaits)."""
        if self.error is not None:
            raise RuntimeError(f"schedule coordinator failed: {type(self.error).__name__}: {self.error}")

    # ---- the thread -------------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                with self.cond:
                    while self._seek_to is None and self.next_id > self._wanted:
                        self.cond.wait()
                    seek = self._take_seek()
                try:
                    if seek is not None:
                        self._restart_stream(seek)
                    self._produce_one()
                except Reseek:
                    # Trainers restarted from a checkpoint ask for an earlier chunk while this one waited
                    # for weights or feedback they will only produce after it: drop it and seek.
                    logger.info("chunk producer: a trainer asked for an earlier chunk; seeking back")
        except BaseException as err:  # surfaced to every waiting trainer by get_chunk
            if isinstance(err, UserError):
                logger.error("chunk producer stopped: %s", err)
            else:
                logger.exception("chunk producer failed")
            with self.cond:
                self.error = err
                self.cond.notify_all()

    def _take_seek(self) -> int | None:
        """The chunk to seek to, if one was asked for (called with the condition held). The producer is there
        from now on: another rank asking for the same chunk while the stream restarts is no second seek (it
        was, and a second restart could re-read a chunk after a checkpoint released its decision, then wait
        for its influence for ever)."""
        seek, self._seek_to = self._seek_to, None
        if seek is not None:
            self.next_id = seek
        return seek

    def _new_stream(self, cursor: dict[str, Any] | None) -> ChunkStream:
        if self._inputs.mixture:
            return self._make_stream(cursor=cursor, mixture_for_chunk=self._mixture_for_chunk)
        return self._make_stream(cursor=cursor)

    def _restart_stream(self, target: int) -> None:
        with self.cond:
            # a chunk restored without a cursor (an arm branched from a trunk of another stream) is no start
            known = [c for c, cursor in self.cursors.items() if c <= target and cursor is not None]
            start = max(known) if known else None
            cursor = self.cursors[start] if start is not None else None
        if cursor is None:
            logger.info("re-reading the data stream from chunk 0 to reach chunk %d (no data cursor)", target)
        else:
            logger.info("restarting the data stream at the cursor of chunk %d to reach chunk %d", start, target)
            self._state.restarts_from_cursor += 1
        if self.stream is not None:
            self.stream.close()
        self.stream = self._new_stream(cursor)
        self._iter = iter(self.stream)
        self._state.stream_restarts += 1
        next_id = start or 0
        while next_id < target:
            next(self._iter)
            next_id += 1
            self._state.chunks_skipped_on_seek += 1
        with self.cond:
            self.next_id = target

    def _produce_one(self) -> None:
        import ray

        if self._iter is None:
            self.stream = self._new_stream(None)
            self._iter = iter(self.stream)
        chunk = next(self._iter)
        assert chunk.chunk_id == self.next_id, (chunk.chunk_id, self.next_id)
        if chunk.cursor is not None:
            with self.cond:
                self.cursors[chunk.chunk_id] = chunk.cursor
        refs = tuple(ray.put(batch) for batch in chunk.batches)
        pending, version = None, None
        with self.cond:
            decided = self._decided(chunk.chunk_id)
        if not decided:
            version, context = self._gather_inputs(chunk, refs)
            with self._scheduler_lock:
                pending = self._scheduler.submit(chunk, refs, context)
        with self.cond:
            self.slots[chunk.chunk_id] = Slot(chunk, refs, pending, version)
            self.next_id = chunk.chunk_id + 1
            self._state.chunks_produced += 1
            self.cond.notify_all()

    def _gather_inputs(self, chunk: Chunk, refs: tuple) -> tuple[int | None, SubmitContext]:
        """(weights version, SubmitContext) of chunk c: what the scheduler waits for before deciding it."""
        c = chunk.chunk_id
        if self._inputs.feedback:
            self._observe_before(c)
        if self._inputs.weights:
            # Before the trainers ask for a chunk they are starting up, and publish version 0 before they ask:
            # no deadline for a wait that began then (a slow start-up is no missed snapshot).
            deadline = self._deadline_s if self._trainers_asked else None
            version, weights = self._mailbox.wait_for_weights(c - self._staleness, deadline, self.interrupt_for_seek)
            return version, SubmitContext(weights=weights, weights_version=version)
        if self._inputs.sketch is not None and self._inputs.sketch.sketched(c):
            self._mailbox.offer_for_sketching(c, refs, list(chunk.batch_ids))
            version = max(0, c - self._staleness)
            influence = self._mailbox.wait_for_influence(c, self._deadline_s, self.interrupt_for_seek)
            return version, SubmitContext(influence=influence, weights_version=version)
        return None, SubmitContext()

    def _observe_before(self, chunk_id: int) -> None:
        """The scheduler observes the feedback of every chunk < chunk_id − staleness (waits for it)."""
        self._mailbox.observe_through(chunk_id - self._staleness - 1, self._scheduler.observe,
                                      self._scheduler_lock, self.interrupt_for_seek)

    def _mixture_for_chunk(self, chunk_id: int) -> dict[str, float]:
        """The mixture chunk ``chunk_id`` is drawn with (the stream calls it just before drawing it):
        the scheduler first observes the feedback of every chunk < chunk_id − staleness, as for ``submit``."""
        if self._inputs.feedback:
            self._observe_before(chunk_id)
        with self._scheduler_lock:
            mixture = self._scheduler.mixture(chunk_id)
        if mixture is None:
            raise RuntimeError(f"the scheduler draws its chunks by mixture but mixture({chunk_id}) returned None")
        return mixture
