"""Order transforms: a decided order reversed or alternated, the controls of D3's direction.

Under the default estimator D3 sorts each chunk by one scalar (d3ray/influence/README.md): a
benefit of D3 can be a benefit of *sortedness*, not of direction. Two controls separate them
(issue #28): the **reverse** of the decided order (just as sorted, the other direction) and the
**alternating** order (the two ends of the decided order interleaved: o0, o_{L-1}, o1, o_{L-2}, ...,
as far from sorted as a permutation of the same batches gets). Only D3 < random < reverse shows
direction.

    Scheduler.submit ──► ChunkDecision(order) ──transform_order(order, kind)──► the order that trains
                                                 record["order_transform"] = kind (schedule log)

``schedule.order_transform`` (every scheduler's common field) selects it; ``none`` leaves the
scheduler untouched (:func:`with_order_transform` returns it as it is).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from d3ray.data.chunker import Chunk
from d3ray.schedule.scheduler import ChunkDecision, ChunkFeedback, SubmitContext

ORDER_TRANSFORMS = ("none", "reverse", "alternate")


def transform_order(order: tuple[int, ...], kind: str) -> tuple[int, ...]:
    """``order`` reversed (``reverse``), its two ends interleaved (``alternate``: o0, o_{L-1}, o1,
    o_{L-2}, ...), or unchanged (``none``).

    Raises:
        ValueError: an unknown ``kind``.
    """
    order = tuple(order)
    if kind == "none":
        return order
    if kind == "reverse":
        return order[::-1]
    if kind == "alternate":
        out: list[int] = []
        lo, hi = 0, len(order) - 1
        while lo <= hi:
            out.append(order[lo])
            if lo != hi:
                out.append(order[hi])
            lo, hi = lo + 1, hi - 1
        return tuple(out)
    raise ValueError(f"schedule.order_transform={kind!r} must be one of {', '.join(ORDER_TRANSFORMS)}")


class _TransformedPending:
    def __init__(self, pending: Any, kind: str) -> None:
        self._pending, self._kind = pending, kind

    def result(self, timeout_s: float | None) -> ChunkDecision:
        decision = self._pending.result(timeout_s)
        return replace(decision, order=transform_order(decision.order, self._kind),
                       record={**decision.record, "order_transform": self._kind})


class TransformedScheduler:
    """A scheduler whose every decided order (fallbacks included) is transformed by ``kind``; all else
    (feedback, mixture, state, actors) is the wrapped scheduler's."""

    def __init__(self, inner: Any, kind: str) -> None:
        transform_order((), kind)  # validates kind
        self.inner, self.kind = inner, kind

    def submit(self, chunk: Chunk, batch_refs: tuple, context: SubmitContext) -> _TransformedPending:
        return _TransformedPending(self.inner.submit(chunk, batch_refs, context), self.kind)

    def observe(self, feedback: ChunkFeedback) -> None:
        self.inner.observe(feedback)

    def mixture(self, chunk_id: int) -> dict[str, float] | None:
        return self.inner.mixture(chunk_id)

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state)

    def actors(self) -> dict[str, list[Any]]:
        return self.inner.actors()

    def close(self) -> None:
        self.inner.close()


def with_order_transform(scheduler: Any, kind: str) -> Any:
    """``scheduler`` with its orders transformed by ``kind`` (itself when ``kind`` is ``none``)."""
    return scheduler if kind == "none" else TransformedScheduler(scheduler, kind)
