"""The coordinator's pure step: a chunk and its decision become what every trainer rank receives.

    Chunk (candidate batches, stream order) ───────────┐
    ChunkDecision (the scheduler's, or its fallback     ├─► serve_chunk ─► DecidedChunk (batches in training
      once ``result(deadline_s)`` timed out)            │                  order, sample ids, domains, weights,
    weights version + its snapshot fields ─────────────┘                  skipped, the schedule-log record)
                                                         └─ check_accounting: every candidate trains or is
                                                            skipped with a reason, exactly once (else an error)

No Ray and no threads: the one Ray call a selection needs (``ray.put`` of the batches it regroups) is
handed in as ``put``, so ``tests/unit/test_coordinator_decide.py`` runs these on hand-written chunks.
``CoordinatorState`` is the coordinator's accounting (the counters ``report()`` returns).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from d3ray.data.chunker import Chunk
from d3ray.schedule.scheduler import ChunkDecision, LossWeighting


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


def serve_chunk(chunk: Chunk, refs: tuple[Any, ...], decision: ChunkDecision, weights_version: int | None,
                snapshot_fields: dict[str, Any] | None, put: Callable[[Any], Any]) -> DecidedChunk:
    """The chunk as the trainers train it under ``decision``.

    Args:
        chunk: the candidates, in stream order.
        refs: per batch of the chunk, its ObjectRef (``ray.put`` once by the producer).
        decision: the scheduler's decision, or its fallback (``PendingDecision.result`` past the deadline).
        weights_version: the snapshot version the decision was made at (None: no weights used).
        snapshot_fields: that snapshot's schedule-log fields (``snapshot_bytes``, ``snapshot_dtype``), or
            None when unknown (no weights, or a decision restored from an earlier coordinator's checkpoint).
        put: stores a regrouped batch and returns its reference (``ray.put``); called only for a
            selection the scheduler did not put itself (``decision.batch_refs``).

    Returns:
        The DecidedChunk; its ``decision.record`` carries ``snapshot_fields`` (a copy: ``decision`` is unchanged).

    Raises:
        RuntimeError: the decision does not account for every candidate exactly once.
    """
    if decision.selection is None:
        batch_refs = tuple(refs[i] for i in decision.order)
        ids = tuple(chunk.batches[i].sample_ids for i in decision.order)
        domains = tuple(chunk.batches[i].domains for i in decision.order)
        trained = {s for batch in chunk.batches for s in batch.sample_ids}
    else:
        selected = decision.batch_refs or tuple(put(chunk.gather(sel)) for sel in decision.selection)
        batch_refs = tuple(selected[i] for i in decision.order)
        flat_ids = [s for batch in chunk.batches for s in batch.sample_ids]
        flat_domains = [d for batch in chunk.batches for d in batch.domains]
        ids = tuple(tuple(flat_ids[j] for j in decision.selection[i]) for i in decision.order)
        domains = tuple(tuple(flat_domains[j] for j in decision.selection[i]) for i in decision.order)
        trained = {s for batch in ids for s in batch}
        assert all(len(b) == chunk.batch_size for b in ids), "every trained batch holds B sequences"
    skipped = {reason: tuple(chunk.gather(idx).sample_ids) if idx else ()
               for reason, idx in decision.skipped.items()}
    check_accounting(chunk, trained, skipped)
    weights = None
    if decision.sample_weights is not None:
        weights = tuple(tuple(decision.sample_weights[i]) for i in decision.order)
    return DecidedChunk(chunk_id=chunk.chunk_id, epoch=chunk.epoch, batch_refs=batch_refs, sample_ids=ids,
                        domains=domains, sample_weights=weights, loss_weighting=decision.loss_weighting,
                        skipped=skipped, decision=with_snapshot_record(decision, snapshot_fields),
                        weights_version=weights_version, mixture=chunk.mixture)


def with_snapshot_record(decision: ChunkDecision, snapshot_fields: dict[str, Any] | None) -> ChunkDecision:
    """The decision with its snapshot's size and dtype in its ``record`` (a copy); unchanged when unknown."""
    if not snapshot_fields:
        return decision
    return replace(decision, record={**decision.record, **snapshot_fields})


def check_accounting(chunk: Chunk, trained: set[str], skipped: dict[str, tuple[str, ...]]) -> None:
    """Every candidate of the chunk trains or is skipped with a reason, exactly once.

    Raises:
        RuntimeError: a candidate neither trained nor skipped, or accounted twice, or a sample not of the chunk.
    """
    produced = [s for batch in chunk.batches for s in batch.sample_ids]
    accounted = sorted(list(trained) + [s for ids in skipped.values() for s in ids])
    if accounted != sorted(produced):
        raise RuntimeError(f"chunk {chunk.chunk_id}: the decision does not account for every sample exactly once")


@dataclass
class CoordinatorState:
    """Counters exposed to the driver and the tests (``ScheduleCoordinator.report``)."""

    chunks_produced: int = 0
    stream_restarts: int = 0
    restarts_from_cursor: int = 0
    chunks_skipped_on_seek: int = 0
    feedback_chunks: int = 0
    served: dict[int, int] = field(default_factory=dict)

    def count_served(self, chunk_id: int) -> None:
        """One more trainer request answered with chunk ``chunk_id`` (a restarted trainer asks again)."""
        self.served[chunk_id] = self.served.get(chunk_id, 0) + 1

    def counters(self) -> dict[str, Any]:
        """The counters as the report's JSON-safe fields (``served``: a copy)."""
        return {"chunks_produced": self.chunks_produced, "stream_restarts": self.stream_restarts,
                "restarts_from_cursor": self.restarts_from_cursor,
                "chunks_skipped_on_seek": self.chunks_skipped_on_seek,
                "feedback_chunks": self.feedback_chunks, "served": dict(self.served)}
