"""ScheduleCoordinator: one actor per run that turns the data stream into decided chunks.

    Ray Data stream ──► ChunkStream (B-sequence batches, chunks of the scheduler's window)
        │  producer thread (producer.py): each batch ray.put once, at most ``prefetch_chunks`` chunks ahead
        ▼
    Scheduler.submit(chunk, refs, SubmitContext)   with what the scheduler waits for (mailbox.py):
        │  weights:  the snapshot of version c − staleness (published by the trainers)
        │  sketches: the trainers sketch chunk c at version c − staleness, and send its S
        │            (they fetch its batches with ``sketch_request(c)``, answer ``publish_influence``)
        │  feedback: observe() the trainers' per-sample losses of every chunk < c − staleness first
        ▼
    get_chunk(chunk_id) ──► serve_chunk (decide.py): the decision, or the fallback past ``deadline_s``
        ──► DecidedChunk(batches in training order, weights, skipped) ──► every rank

It is a threaded actor: trainer ranks block in ``get_chunk`` while the producer thread reads, batches
and submits the chunks ahead. Chunks are keyed by ``chunk_id``, so a trainer that restarts from a
checkpoint asks for the chunk after its cursor: if that chunk has already been released, the stream
restarts at the newest data cursor known at or before that chunk (``Chunk.cursor`` of every chunk it
produced, or the one a checkpoint restored), seeking in the shards instead of re-reading them, and
skips forward only from there. A checkpoint carries ``checkpoint_state``: the decision of the next
chunk, the scheduler's state after the feedback of every trained chunk and the data cursor of the
next chunk, so that a resumed run (even with a new coordinator) decides exactly as an uninterrupted
one and starts reading where it stopped.

A mixer (``ScheduleConfig.draws_mixture``) decides the stream itself: the coordinator builds the stream with
``make_stream(cursor=..., mixture_for_chunk=...)``, and before chunk c is drawn the callback makes the
scheduler observe the feedback of every chunk < c − staleness (the rule ``submit`` follows) and returns
``scheduler.mixture(c)``; the chunk's mixture travels with it (``DecidedChunk.mixture``, schedule log).

This class holds the decisions (made, or restored from a checkpoint) and answers the remote methods;
the mailbox holds what the trainers send, the producer the stream and the slots, decide.py the
pure step from a decision to the chunk served. One condition guards all their tables.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from d3ray.data.chunker import ChunkStream
from d3ray.errors import UserError
from d3ray.schedule.coordinator.decide import CoordinatorState, DecidedChunk, serve_chunk
from d3ray.schedule.coordinator.mailbox import Mailbox
from d3ray.schedule.coordinator.producer import ChunkProducer, Slot, SubmitInputs
from d3ray.schedule.scheduler import ChunkDecision, ChunkFeedback, Scheduler, TrainerRequests

logger = logging.getLogger(__name__)


class ScheduleCoordinator:
    """Produces decided chunks ahead of the trainers (plain class; wrapped by ``ray.remote`` at creation).

    Args:
        make_stream: ``make_stream(cursor=...)`` gives a fresh, deterministic :class:`ChunkStream` that
            starts at ``cursor`` (a ``Chunk.cursor``), or at chunk 0 when it is None; for a mixer
            (``draws_mixture``) it is called with ``mixture_for_chunk=`` too (the stream draws by domain).
        scheduler: decides each chunk.
        requests: what the scheduler asks of the trainers (its config's ``trainer_requests()``): what to
            wait for before a decision, read once into ``SubmitInputs``.
        prefetch_chunks: chunks produced ahead of the highest requested chunk id.
        staleness: chunk c uses weights version c − staleness and the feedback of chunks < c − staleness.
        deadline_s: how long ``get_chunk`` waits for a decision before using the fallback.
        run_dir: the run directory (this actor logs to ``<run_dir>/logs/coordinator.log``).
        draws_mixture: the scheduler is a mixer (its config's ``draws_mixture``): the stream draws by domain.
    """

    def __init__(
        self,
        make_stream: Callable[..., ChunkStream],
        scheduler: Scheduler,
        requests: TrainerRequests,
        prefetch_chunks: int = 2,
        staleness: int = 1,
        deadline_s: float | None = None,
        run_dir: str | None = None,
        draws_mixture: bool = False,
    ) -> None:
        if run_dir is not None:
            from d3ray.run_files import route_logs_to_run_dir

            route_logs_to_run_dir(run_dir, "coordinator")
        self._scheduler = scheduler
        self._inputs = SubmitInputs.of(requests, draws_mixture)
        self._staleness = staleness
        self._deadline_s = deadline_s
        self._cond = threading.Condition()
        self._scheduler_lock = threading.Lock()  # every call into the scheduler holds it
        self._decided: dict[int, ChunkDecision] = {}
        self._decided_versions: dict[int, int | None] = {}  # chunk_id -> weights version of its decision
        self.state = CoordinatorState()
        self._mailbox = Mailbox(self._cond)
        self._producer = ChunkProducer(make_stream, scheduler, self._scheduler_lock, self._mailbox, self._inputs,
                                       self._decided.__contains__, self.state, prefetch_chunks, staleness,
                                       deadline_s)
        self._producer.start()

    # ---- trainer-facing -------------------------------------------------------------------
    def scheduler_ready(self) -> float:
        """Block until every actor the scheduler started has finished its constructor (the influence
        model built, the solver's kernels compiled); the seconds waited here. The trainers call it
        before their clock starts: the actors' start-up overlaps the trainers' own and does not
        land in the first chunks' steps."""
        import ray
        from ray.exceptions import RayError

        start = time.perf_counter()
        for actor in (a for group in self._scheduler.actors().values() for a in group):
            try:
                ray.get(actor.__ray_ready__.remote())
            except RayError as err:  # its chunks fall back with the reason, as for any later failure
                logger.warning("a scheduler actor did not start: %s", err)
        return time.perf_counter() - start

    def get_chunk(self, chunk_id: int, through: int | None = None) -> DecidedChunk:
        """Block until chunk ``chunk_id`` is produced and decided; its batches in training order.
        ``through``: the last chunk the trainers expect to train (as far as they know), past which nothing is
        produced ahead (None: ``prefetch_chunks`` ahead whatever the run's length)."""
        with self._cond:
            self._producer.request(chunk_id, through)
            while chunk_id not in self._producer.slots and self._producer.error is None:
                self._cond.wait(timeout=1.0)
            if self._producer.error is not None:
                err = self._producer.error
                if isinstance(err, UserError):
                    raise err
                raise RuntimeError(
                    f"schedule coordinator failed while producing chunk {chunk_id}: {type(err).__name__}: {err}"
                ) from err
            slot = self._producer.slots[chunk_id]
        served = slot.served or self._serve(slot)
        with self._cond:
            slot.served = served
            self.state.count_served(chunk_id)
        return served

    def feedback(self, feedback: ChunkFeedback) -> None:
        """Per-sample losses of one trained chunk (trainer rank 0, once per chunk; repeats are ignored)."""
        with self._cond:  # the mailbox's condition: the count moves with the feedback kept
            if self._mailbox.put_feedback(feedback):
                self.state.feedback_chunks += 1

    def sketch_request(self, chunk_id: int) -> tuple[tuple, list[int]] | None:
        """The batches (refs, global batch ids) of chunk ``chunk_id`` for the trainers to sketch
        (a ``SketchRequest``); waits until the chunk is produced. None when it needs no sketches any
        more: decided (e.g. restored from a checkpoint) or already sketched (trainers that rolled back)."""
        with self._cond:
            self._producer.want(chunk_id)
        return self._mailbox.sketch_request(chunk_id, self._decided.__contains__, self._producer.raise_if_failed)

    def publish_influence(self, chunk_id: int, influence: list) -> None:
        """The trainers' influence of chunk ``chunk_id`` (``[ObjectRef of ChunkInfluence]``, trainer rank 0)."""
        self._mailbox.put_influence(chunk_id, influence)

    def publish_weights(self, version: int, weights: list, nbytes: int | None = None, dtype: str | None = None) -> None:
        """Weights after ``version`` trained chunks (``weights`` = [ObjectRef of a state dict, and of the
        AdamWState if shipped]); ``nbytes`` and ``dtype`` (their payload and the dtype they travel in)
        go into the schedule-log row of every chunk decided at this version (``snapshot_bytes``,
        ``snapshot_dtype``)."""
        self._mailbox.put_weights(version, weights, nbytes, dtype)

    def release(self, before_chunk_id: int) -> None:
        """Drop chunks with id < ``before_chunk_id`` (they are covered by a checkpoint)."""
        with self._cond:
            self._producer.release(before_chunk_id)
            for cid in [c for c in self._decided if c < before_chunk_id]:
                del self._decided[cid]
                self._decided_versions.pop(cid, None)
            self._mailbox.release(before_chunk_id, self._staleness)

    # ---- checkpoints ----------------------------------------------------------------------
    def checkpoint_state(self, next_chunk: int) -> dict[str, Any]:
        """What a checkpoint at ``next_chunk`` must hold for the resumed run to decide as this one:
        the decisions of the chunks from ``next_chunk`` on that are already decided, and the
        scheduler's state after observing the feedback of every chunk < ``next_chunk``."""
        with self._cond:
            decisions = {str(c): d.to_state() for c, d in sorted(self._decided.items()) if c >= next_chunk}
            versions = {c: self._decided_versions.get(int(c)) for c in decisions}
            cursor = self._producer.cursors.get(next_chunk)
        state: dict[str, Any] = {"decisions": decisions, "weights_versions": versions,
                                 "observed_through": self._mailbox.observed_through}
        if cursor is not None:
            state["data_cursor"] = {"chunk_id": next_chunk, "cursor": cursor}
        if self._inputs.feedback:
            self._mailbox.observe_through(next_chunk - 1, self._scheduler.observe, self._scheduler_lock,
                                          self._producer.raise_if_failed)
            with self._scheduler_lock:
                state["scheduler"] = self._scheduler.state_dict()
                state["observed_through"] = self._mailbox.observed_through
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
                self._producer.cursors.setdefault(cid, state["data_cursor"]["cursor"])
                self._producer.resume_at(cid)
        with self._scheduler_lock:
            through = int(state.get("observed_through", -1))
            if "branch_at" in state and "scheduler" not in state:
                # A compare arm branching from a shared trunk (d3ray/lab/compare/trunk.py): its scheduler
                # starts fresh at that chunk and sees no feedback of the trunk's chunks.
                self._mailbox.expect_no_feedback_before(int(state["branch_at"]))
            elif "scheduler" in state and through > self._mailbox.observed_through:
                self._scheduler.load_state_dict(state["scheduler"])
                self._mailbox.observed_by_restore(through)

    # ---- driver-facing --------------------------------------------------------------------
    def error(self) -> BaseException | None:
        """The exception that stopped the chunk producer, if any (the driver re-raises a user error)."""
        with self._cond:
            return self._producer.error

    def report(self) -> dict[str, Any]:
        """Counters of the coordinator and the chunk stream, plus the data-quality ledger if any."""
        with self._cond:
            stream = self._producer.stream
            out = self.state.counters()
        if stream is not None:
            out["dropped_tail_sequences"] = stream.stats.dropped_tail_sequences
            out["per_epoch_chunks"] = list(stream.stats.per_epoch_chunks)
            if stream.stats.domain_draws:
                out["domain_draws"] = dict(stream.stats.domain_draws)
                out["domain_epochs"] = dict(stream.stats.domain_epochs)
            ledger = stream.ledger
            out["data_quality"] = {**ledger.to_dict(), "bad_by_reason": ledger.bad_by_reason()}
        return out

    # ---- deciding -------------------------------------------------------------------------
    def _serve(self, slot: Slot) -> DecidedChunk:
        """The slot's chunk under its decision: restored, or the scheduler's result by the deadline
        (its fallback past it); the first decision made for a chunk is the one every rank trains."""
        import ray

        cid = slot.chunk.chunk_id
        with self._cond:
            decision = self._decided.get(cid)
        if decision is None:
            assert slot.pending is not None
            decision = slot.pending.result(self._deadline_s)
            with self._cond:
                decision = self._decided.setdefault(cid, decision)
                self._decided_versions.setdefault(cid, slot.weights_version)
        with self._cond:
            version = self._decided_versions.get(cid)
        return serve_chunk(slot.chunk, slot.refs, decision, version, self._mailbox.snapshot_fields(version),
                           put=ray.put)
