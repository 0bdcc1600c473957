"""A mixer and an order scheduler, as one scheduler to the coordinator.

    mixture(c) ── memoised per chunk: the mixer's rule once, at the state the coordinator reached
        │         (feedback of every chunk < c − staleness observed), then the same answer forever
        ▼
    ChunkStream draws chunk c by domain (d3ray/data/mixture.py) ─► submit(chunk) ─► order.submit
    observe(feedback of chunk c) ─► mixer.observe(feedback, the mixture chunk c was drawn with), order.observe

Memoising makes ``mixture`` a function of the chunk id whatever asks for it when: the stream asks again
when it restarts from a cursor (a trainer restarted from an older checkpoint), and a resumed run asks for
the chunks already decided before its checkpoint, whose mixtures are in the state (``decided``): a mixer
that has observed more feedback since could not recompute them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from d3ray.data.chunker import Chunk
from d3ray.schedule.scheduler import (
    ChunkDecision,
    ChunkFeedback,
    PendingDecision,
    Scheduler,
    StatelessBase,
    SubmitContext,
)


class Mixer(Protocol):
    """One mixing algorithm: the rule, the update and the state (the rest is :class:`MixScheduler`'s)."""

    def decide(self, chunk_id: int) -> dict[str, float]:
        """The mixture of chunk ``chunk_id`` at the current state (asked once per chunk)."""
        ...

    def observe(self, feedback: ChunkFeedback, mixture: dict[str, float]) -> None:
        """Update from the per-sample losses of a trained chunk drawn with ``mixture``."""
        ...

    def submit(self, chunk: Chunk, batch_refs: tuple) -> None:
        """Start the model work a chunk needs before its feedback arrives (DoReMi's reference losses)."""
        ...

    def record(self, chunk_id: int) -> dict[str, Any]:
        """Extra fields of chunk ``chunk_id``'s schedule-log record."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def actors(self) -> dict[str, list[Any]]: ...

    def close(self) -> None: ...


class MixerBase(StatelessBase):
    """Defaults of :class:`Mixer` for a mixer without feedback, model work, state or actors."""

    def observe(self, feedback: ChunkFeedback, mixture: dict[str, float]) -> None:
        return None

    def submit(self, chunk: Chunk, batch_refs: tuple) -> None:
        return None

    def record(self, chunk_id: int) -> dict[str, Any]:
        return {}


class MixScheduler:
    """``mixer`` decides each chunk's mixture, ``order`` orders the chunk's batches (see the module docstring).

    Args:
        mixer: the mixing algorithm.
        order: the order scheduler of each drawn chunk.
        name: the scheduler's name in the schedule log.
    """

    def __init__(self, mixer: Mixer, order: Scheduler, name: str) -> None:
        self.mixer = mixer
        self.order = order
        self.name = name
        self._decided: dict[int, dict[str, float]] = {}
        self._observed_through = -1

    def mixture(self, chunk_id: int) -> dict[str, float]:
        if chunk_id not in self._decided:
            self._decided[chunk_id] = {d: float(w) for d, w in self.mixer.decide(chunk_id).items()}
        return dict(self._decided[chunk_id])

    def submit(self, chunk: Chunk, batch_refs: tuple, context: SubmitContext) -> PendingDecision:
        self.mixer.submit(chunk, batch_refs)
        record = {"scheduler": self.name, **self.mixer.record(chunk.chunk_id)}
        return MixPending(self.order.submit(chunk, batch_refs, context), record)

    def observe(self, feedback: ChunkFeedback) -> None:
        mixture = self._decided.get(feedback.chunk_id)
        if mixture is None:
            raise RuntimeError(f"{self.name}: feedback of chunk {feedback.chunk_id}, whose mixture was never decided")
        self.mixer.observe(feedback, mixture)
        self.order.observe(feedback)
        self._observed_through = max(self._observed_through, feedback.chunk_id)

    def state_dict(self) -> dict[str, Any]:
        decided = {str(c): m for c, m in sorted(self._decided.items()) if c > self._observed_through}
        return {"mixer": self.mixer.state_dict(), "order": self.order.state_dict(),
                "observed_through": self._observed_through, "decided": decided}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.mixer.load_state_dict(state.get("mixer", {}))
        self.order.load_state_dict(state.get("order", {}))
        self._observed_through = int(state.get("observed_through", -1))
        # Mixtures decided before this state was restored (a fresh coordinator starts streaming at once)
        # were decided at another state: the checkpoint's own decisions replace them.
        self._decided = {int(c): {d: float(w) for d, w in m.items()} for c, m in state.get("decided", {}).items()}

    def actors(self) -> dict[str, list[Any]]:
        return {**self.mixer.actors(), **self.order.actors()}

    def close(self) -> None:
        self.mixer.close()
        self.order.close()


class MixPending:
    """The order stage's pending decision, with the mixer's fields in the record (the mixer's name first)."""

    def __init__(self, pending: PendingDecision, record: dict[str, Any]) -> None:
        self._pending = pending
        self._record = record

    def result(self, timeout_s: float | None) -> ChunkDecision:
        decision = self._pending.result(timeout_s)
        record = {**decision.record, "order_scheduler": decision.record.get("scheduler"), **self._record}
        return dataclasses.replace(decision, record=record)
