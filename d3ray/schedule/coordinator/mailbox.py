"""The coordinator's inputs mailbox: what the trainers send, by key, and the waits for it.

    trainer rank 0 ──publish_weights(version, [refs])──► weights by version (+ snapshot_bytes / _dtype)
                   ──feedback(ChunkFeedback)───────────► feedback by chunk ──observe_through(c)──► scheduler
                   ──publish_influence(c, [ref])───────► in-trainer sketches (S) by chunk
                   ◄─sketch_request(c)───────────────── the chunk's batches to sketch (put by the producer)

Thread-safe: every table is guarded by one condition, shared with the producer and the actor, so that
a wait here also wakes on a seek request or a producer failure. A wait takes an ``interrupt`` callable,
run under that condition on every wake-up, which raises to end the wait (the producer's reseek, a
failed producer). Observing feedback also holds the scheduler lock, as every call into the scheduler
does; waiting holds only the condition, so that a ``restore`` can move the scheduler past the awaited
chunks at any time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from d3ray.schedule.scheduler import ChunkFeedback

Interrupt = Callable[[], None]
"""Called under the condition on every wake-up of a wait; raises to end the wait."""


class Mailbox:
    """The trainers' weight snapshots, feedback and in-trainer sketches, keyed by version or chunk.

    Args:
        cond: the coordinator's condition (guards every table; waits wake on its notifications).
    """

    def __init__(self, cond: threading.Condition) -> None:
        self.cond = cond
        self._weights: dict[int, list] = {}  # weights version -> [ObjectRef of a state dict (, AdamWState)]
        self._snapshot_fields: dict[int, dict[str, Any]] = {}  # weights version -> its schedule-log fields
        self._feedback: dict[int, ChunkFeedback] = {}  # chunk_id -> feedback not yet observed
        self.observed_through = -1  # the scheduler has observed the feedback of every chunk <= this one
        self._influence: dict[int, list] = {}  # chunk_id -> [ObjectRef of the trainers' ChunkInfluence]
        self._candidates: dict[int, tuple[tuple, list[int]]] = {}  # chunk_id -> (batch refs, batch ids) to sketch

    # ---- from the trainers ------------------------------------------------------------------------------
    def put_weights(self, version: int, weights: list, nbytes: int | None, dtype: str | None) -> None:
        """The snapshot after ``version`` trained chunks, and its payload bytes and dtype when given."""
        with self.cond:
            self._weights[version] = weights
            self._snapshot_fields.pop(version, None)
            if nbytes is not None:
                self._snapshot_fields[version] = {"snapshot_bytes": int(nbytes), "snapshot_dtype": dtype}
            for v in [v for v in self._snapshot_fields if v not in self._weights]:  # released with their weights
                del self._snapshot_fields[v]
            self.cond.notify_all()

    def put_feedback(self, feedback: ChunkFeedback) -> bool:
        """Keep one chunk's feedback; False for a repeat or a chunk already observed (ignored)."""
        with self.cond:
            new = feedback.chunk_id > self.observed_through and feedback.chunk_id not in self._feedback
            if new:
                self._feedback[feedback.chunk_id] = feedback
            self.cond.notify_all()
            return new

    def put_influence(self, chunk_id: int, influence: list) -> None:
        """The trainers' sketch of ``chunk_id`` (the first one sent is kept)."""
        with self.cond:
            self._influence.setdefault(chunk_id, influence)
            self.cond.notify_all()

    # ---- for the producer and the actor -----------------------------------------------------------------
    def snapshot_fields(self, version: int | None) -> dict[str, Any] | None:
        """The schedule-log fields of snapshot ``version`` (None: unknown, or no weights used)."""
        with self.cond:
            return self._snapshot_fields.get(version) if version is not None else None

    def offer_for_sketching(self, chunk_id: int, refs: tuple, batch_ids: list[int]) -> None:
        """The batches of ``chunk_id`` that ``sketch_request`` hands the trainers."""
        with self.cond:
            self._candidates[chunk_id] = (refs, batch_ids)
            self.cond.notify_all()

    def sketch_request(self, chunk_id: int, decided: Callable[[int], bool],
                       interrupt: Interrupt) -> tuple[tuple, list[int]] | None:
        """The batches of ``chunk_id`` to sketch (waits until offered); None once it needs no sketch:
        ``decided(chunk_id)`` (e.g. restored from a checkpoint) or already sketched (rolled-back trainers)."""
        with self.cond:
            while True:
                if decided(chunk_id) or chunk_id in self._influence:
                    return None
                if chunk_id in self._candidates:
                    return self._candidates[chunk_id]
                interrupt()
                self.cond.wait(timeout=1.0)

    def wait_for_weights(self, version: int, deadline_s: float | None,
                         interrupt: Interrupt) -> tuple[int | None, list | None]:
        """(version, snapshot) of ``version`` (waits for it). A resumed run that lacks it takes the oldest
        newer one; past the deadline, the newest there is ((None, None) if none)."""
        version = max(0, version)
        start = time.monotonic()
        with self.cond:
            while True:
                if version in self._weights:
                    return version, self._weights[version]
                newer = [v for v in self._weights if v > version]
                if newer:
                    return min(newer), self._weights[min(newer)]
                if deadline_s is not None and time.monotonic() - start > deadline_s:
                    newest = max(self._weights) if self._weights else None
                    return newest, (self._weights[newest] if newest is not None else None)
                interrupt()
                self.cond.wait(timeout=0.5)

    def wait_for_influence(self, chunk_id: int, deadline_s: float | None, interrupt: Interrupt) -> list | None:
        """The trainers' sketch of ``chunk_id`` (waits for it); None past the deadline (the scheduler
        then falls back)."""
        start = time.monotonic()
        with self.cond:
            while chunk_id not in self._influence:
                if deadline_s is not None and time.monotonic() - start > deadline_s:
                    return None
                interrupt()
                self.cond.wait(timeout=0.5)
            return self._influence[chunk_id]

    def observe_through(self, chunk_id: int, observe: Callable[[ChunkFeedback], None],
                        scheduler_lock: threading.Lock, interrupt: Interrupt) -> None:
        """Hand ``observe`` the feedback of every chunk <= ``chunk_id`` not yet observed, in chunk order
        (waits for it); ``observe`` runs under ``scheduler_lock``."""
        while True:
            with self.cond:
                while self.observed_through < chunk_id and self.observed_through + 1 not in self._feedback:
                    interrupt()
                    self.cond.wait(timeout=1.0)
                if self.observed_through >= chunk_id:
                    return
                nxt = self.observed_through + 1
            with scheduler_lock:
                with self.cond:
                    if self.observed_through + 1 != nxt or nxt not in self._feedback:
                        continue  # observed meanwhile, or a restore moved past it
                    feedback = self._feedback.pop(nxt)
                observe(feedback)
                with self.cond:
                    self.observed_through = nxt
                    self.cond.notify_all()

    def observed_by_restore(self, through: int) -> None:
        """A restored scheduler state covers the feedback of every chunk <= ``through``: drop it."""
        with self.cond:
            self.observed_through = through
            for cid in [c for c in self._feedback if c <= through]:
                del self._feedback[cid]
            self.cond.notify_all()

    def expect_no_feedback_before(self, chunk_id: int) -> None:
        """A fresh scheduler branching at ``chunk_id`` (a compare arm): no feedback before it to wait for."""
        with self.cond:
            self.observed_through = max(self.observed_through, chunk_id - 1)
            self.cond.notify_all()

    def release(self, before_chunk_id: int, staleness: int) -> None:
        """Drop what no chunk from ``before_chunk_id`` on can use (covered by a checkpoint)."""
        with self.cond:
            for v in [v for v in self._weights if v < before_chunk_id - staleness - 1]:
                del self._weights[v]
            for table in (self._influence, self._candidates):
                for cid in [c for c in table if c < before_chunk_id]:
                    del table[cid]
            self.cond.notify_all()
