"""The scheduler protocol: every data scheduler (order, select, weight, mix) speaks it.

A scheduler turns a chunk of candidate batches into a :class:`ChunkDecision`: which samples train
(selection), in which batch order (ordering), with which per-sample loss weights (weighting). It
works in two phases so that model work (influence, scoring) runs one chunk ahead of the trainers:
``submit(chunk, batch_refs, context)`` starts the work and returns a :class:`PendingDecision`;
``result(timeout_s)`` returns the decision, or the scheduler's fallback once the deadline passes.

    ScheduleConfig (typed, registered)        ── kind, trainer_requests(), draws_mixture, before_run(ctx),
        │ build(BuildContext)                     actor_requests(), window_batches(): known before anything starts
        ▼
    Scheduler ── submit(chunk, refs, SubmitContext) → PendingDecision ─► ChunkDecision
             ── observe(ChunkFeedback)     per-sample losses of each trained chunk, in chunk order
             ── mixture(chunk_id)          mixers: the domain weights chunk ``chunk_id`` is drawn with
             ── state_dict() / load_state_dict()   a resumed run makes the same decisions
             ── actors()   the Ray actors it started (placement.json);  close()

Nothing outside a scheduler probes its internals: what it asks of the trainers is a typed
:class:`TrainerRequests` (a weights snapshot, in-trainer sketches, training feedback), carried out by
one module on the trainers' side (d3ray/train/scheduling/trainer_side.py); what it starts and whether the stream
draws by domain are declared by its config too. Decisions must be a pure function of the
chunk, the seed, the weights snapshot of version ``chunk_id - staleness`` and the feedback of the
chunks before ``chunk_id - staleness``: ``submit`` never changes what later decisions depend on;
only ``observe`` does (docs/design/system.md §6, determinism). The same holds for
``mixture(chunk_id)`` (mixers, ``ScheduleConfig.draws_mixture``): the coordinator asks for it just before
the stream draws the chunk, after the scheduler observed the feedback of every chunk before ``chunk_id - staleness``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

import numpy as np

from d3ray.data.chunker import Chunk
from d3ray.influence.config import InfluenceConfig

#: Dtypes a weights snapshot may travel in (``SnapshotRequest.dtype``; d3ray/train/scheduling/snapshot.py).
SNAPSHOT_DTYPES = ("bfloat16", "float32")


class Kind(StrEnum):
    """What a scheduler decides (docs/design/system.md §4)."""

    ORDER = "order"
    """The order of a chunk's batches (D3, curricula, random, sequential, mtl)."""
    SELECT = "select"
    """Which samples of a candidate window train (LESS, NICE, loss, delta-loss, TSDS, NEAR)."""
    WEIGHT = "weight"
    """Per-sample loss weights inside the step (loss reweighting)."""
    MIX = "mix"
    """The domain each next sequence is drawn from (DoReMi, ODM, RegMix, static)."""


@dataclass(frozen=True)
class SnapshotRequest:
    """The trainers publish a snapshot of their weights at every chunk boundary.

    Cadence: one snapshot per chunk boundary, version ``v`` = the chunks trained before it (version 0
    before the first step, published by trainer rank 0 itself); chunk c is decided with version
    ``c − staleness``, the only versions the decision rule reads.
    """

    dtype: str = "float32"
    """The dtype the weights (and optimizer state) travel in (``SNAPSHOT_DTYPES``): ``bfloat16`` halves
    the bytes, for a reader that accepts 16-bit torch tensors (d3's influence actors); ``float32`` numpy
    arrays otherwise (every reader accepts them)."""
    optimizer_state: bool = False
    """The AdamW state travels with every snapshot (optimizer-aware influence, ``preconditioner: adam``)."""
    staleness: int = 0
    """The reader's ``staleness`` where it declares it (D3's influence actors): at 1 the snapshot of version v
    is first read for chunk v + 1, so a boundary saves its checkpoint (which waits for chunk v's decision
    only) before publishing it (``trainer_side.prepares_after_checkpoint``). 0: published first."""

    def __post_init__(self) -> None:
        if self.dtype not in SNAPSHOT_DTYPES:
            raise ValueError(f"SnapshotRequest.dtype must be one of {list(SNAPSHOT_DTYPES)}, got {self.dtype!r}")

    def __or__(self, other: SnapshotRequest) -> SnapshotRequest:
        """One snapshot serves both readers (a staged scheduler and its order): 16 bits only if both
        accept 16 bits, else float32 (which every reader accepts); the optimizer state if either reads it;
        the smaller staleness (the reader that needs it sooner)."""
        dtype = "bfloat16" if self.dtype == other.dtype == "bfloat16" else "float32"
        return SnapshotRequest(dtype=dtype, optimizer_state=self.optimizer_state or other.optimizer_state,
                               staleness=min(self.staleness, other.staleness))


@dataclass(frozen=True)
class SketchRequest:
    """The trainers sketch each chunk themselves on their ZeRO-3 shards (D3 ``schedule.placement:
    in_trainer``, d3ray/train/scheduling/sharded_influence.py) and hand the coordinator its S.

    Chunk c is sketched at weights version ``max(0, c − staleness)``: chunks 0..staleness before the
    first step, then chunk ``v + staleness`` at each version v (:meth:`due`); chunk 0 not at all when it
    trains in stream order (``first_chunk_scored`` False: D3's ``first_chunk: stream``).
    """

    influence: InfluenceConfig
    """The estimator, sketch and cost knobs (the same on every rank)."""
    staleness: int
    """``ScheduleConfig.staleness``."""
    L: int
    """``ScheduleConfig.L``: with the run's steps, the chunks the run trains (later ones are never sketched)."""
    first_chunk_scored: bool = True
    """False: chunk 0 is decided without a sketch (in stream order), so nobody sketches it or waits for it."""

    def sketched(self, chunk_id: int) -> bool:
        """Whether chunk ``chunk_id`` gets a sketch (every chunk but a chunk 0 decided in stream order)."""
        return chunk_id > 0 or self.first_chunk_scored

    def due(self, version: int, total_chunks: int) -> list[int]:
        """Chunks sketched at weights version ``version`` of a run of ``total_chunks`` chunks."""
        chunks = range(self.staleness + 1) if version == 0 else [version + self.staleness]
        return [c for c in chunks if c < total_chunks and self.sketched(c)]


@dataclass(frozen=True)
class FeedbackRequest:
    """Trainer rank 0 sends the per-sample training losses of every trained chunk (``observe``)."""


@dataclass(frozen=True)
class TrainerRequests:
    """What a scheduler asks of the trainers (None: not asked). Declared by its config
    (``ScheduleConfig.trainer_requests()``), carried out by d3ray/train/scheduling/trainer_side.py, and read by the
    coordinator to know what to wait for before a decision."""

    snapshot: SnapshotRequest | None = None
    sketch: SketchRequest | None = None
    feedback: FeedbackRequest | None = None

    def __or__(self, other: TrainerRequests) -> TrainerRequests:
        """A staged scheduler's requests: its own and its order stage's (one snapshot serves both).

        Raises:
            ValueError: both stages ask for different in-trainer sketches (the trainers sketch one way).
        """
        if self.sketch is not None and other.sketch is not None and self.sketch != other.sketch:
            raise ValueError(f"two stages ask the trainers for different sketches: {self.sketch} and {other.sketch}")
        snapshot = (self.snapshot | other.snapshot if self.snapshot is not None and other.snapshot is not None
                    else self.snapshot or other.snapshot)
        return TrainerRequests(snapshot=snapshot, sketch=self.sketch or other.sketch,
                               feedback=self.feedback or other.feedback)


@dataclass(frozen=True)
class ActorRequest:
    """Ray actors a scheduler starts: ``count`` actors of ``role``, each holding ``resources``."""

    role: str
    count: int
    resources: dict[str, float]
    """Per actor, e.g. ``{"CPU": 1.0, "GPU": 0.25, "solver_node": 1.0}``."""

    def total(self) -> dict[str, float]:
        return {name: self.count * amount for name, amount in self.resources.items() if amount}


@dataclass(frozen=True)
class LossWeighting:
    """An in-step weighting rule: per-sample weights computed from the step's own (detached) losses.

    Loss reweighting (Sow et al. 2025) weights each sample by its current loss, which exists only
    inside the step; the rule travels with the decision and ``d3ray.schedule.weight.loss_weights``
    applies it. ``params`` are the strategy's parameters (all floats, JSON-safe).
    """

    strategy: str
    params: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ChunkDecision:
    """What trains of one chunk, in which order, with which weights; and what to log about it.

    Attributes:
        order: positions into the decision's batches in training order (a permutation).
        selection: the trained batches as flat indices into the chunk's candidate sequences
            (batch b, row r of the chunk is ``b * B + r``); None = the chunk's own batches.
        sample_weights: per batch of the decision (before ordering), the B loss weights; None = 1.
        loss_weighting: an in-step weighting rule, or None.
        skipped: reason → flat candidate indices that do not train (every sample is accounted for).
        fallback: True when the scheduler missed its deadline or failed and this is its fallback.
        record: fields for the schedule log (scheduler, costs, seconds, ...).
        matrix: the chunk's S (L, L) when the scheduler computed one (saved by trainer rank 0).
    """

    order: tuple[int, ...]
    selection: tuple[tuple[int, ...], ...] | None = None
    sample_weights: tuple[tuple[float, ...], ...] | None = None
    loss_weighting: LossWeighting | None = None
    skipped: dict[str, tuple[int, ...]] = field(default_factory=dict)
    fallback: bool = False
    record: dict[str, Any] = field(default_factory=dict)
    matrix: np.ndarray | None = None
    batch_refs: tuple | None = None
    """ObjectRefs of the selected batches when the scheduler already put them (not checkpointed)."""

    def to_state(self) -> dict[str, Any]:
        """JSON-safe form kept in checkpoints (everything but ``matrix``): a resumed run logs a restored
        decision with the record that made it (what decided it, its predictions), marked as restored."""
        return {
            "order": list(self.order),
            "selection": None if self.selection is None else [list(b) for b in self.selection],
            "sample_weights": None if self.sample_weights is None else [list(w) for w in self.sample_weights],
            "loss_weighting": None if self.loss_weighting is None else {
                "strategy": self.loss_weighting.strategy, "params": dict(self.loss_weighting.params)},
            "skipped": {k: list(v) for k, v in self.skipped.items()},
            "fallback": self.fallback,
            "record": dict(self.record),  # JSON already: the schedule log writes it
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> ChunkDecision:
        lw = state.get("loss_weighting")
        return cls(
            order=tuple(int(i) for i in state["order"]),
            selection=None if state.get("selection") is None else tuple(tuple(int(i) for i in b)
                                                                         for b in state["selection"]),
            sample_weights=None if state.get("sample_weights") is None else tuple(
                tuple(float(w) for w in ws) for ws in state["sample_weights"]),
            loss_weighting=None if lw is None else LossWeighting(lw["strategy"], dict(lw["params"])),
            skipped={k: tuple(int(i) for i in v) for k, v in state.get("skipped", {}).items()},
            fallback=bool(state.get("fallback", False)),
            record={**state.get("record", {}), "reused_from_checkpoint": True},
        )


@dataclass(frozen=True)
class ChunkFeedback:
    """Per-sample training losses of one trained chunk (one small call per chunk, from trainer rank 0).

    ``losses[i]`` is the token-mean loss of ``sample_ids[i]`` in the step that trained it.
    """

    chunk_id: int
    sample_ids: tuple[str, ...]
    domains: tuple[str, ...]
    losses: np.ndarray


@dataclass(frozen=True)
class SubmitContext:
    """What the coordinator hands a scheduler with a chunk."""

    weights: list | None = None
    """``[ObjectRef]`` of the weights snapshot of version ``weights_version`` (a :class:`SnapshotRequest`)."""
    weights_version: int | None = None
    """Chunks trained before that snapshot (or before the trainers sketched the chunk)."""
    influence: list | None = None
    """``[ObjectRef]`` of the chunk's ``ChunkInfluence`` (S) from the trainers (a :class:`SketchRequest`)."""


@dataclass(frozen=True)
class BuildContext:
    """What a scheduler may use when it is built (in the driver, after ``ray.init``)."""

    seed: int
    model_config: dict[str, Any]
    """The trainers' transformers config (dict), for actors that rebuild the model."""
    model: Any
    """The run's ``ModelConfig``."""
    run_name: str
    run_dir: str
    """Where actors may write (fault-drill markers, logs)."""
    batch_size: int
    """B, sequences per global batch."""
    total_chunks: int
    """Chunks the run trains (``ceil(train.steps / L)``), for schedules over training progress."""
    tokenizer_dir: str | None = None
    eval_sets: list | None = None
    """``[ObjectRef]`` of the run's held-out sets (name → (n, T) int32), e.g. a selector's target."""
    domains: list[str] | None = None
    """Mixers: the domains they mix over (the corpus' domains, or ``schedule.domains``), resolved and
    checked by the driver before Ray starts (``d3ray.schedule.mix.domains``)."""


class PendingDecision(Protocol):
    def result(self, timeout_s: float | None) -> ChunkDecision: ...


class Scheduler(Protocol):
    """A built scheduler (see the module docstring for the contract)."""

    def submit(self, chunk: Chunk, batch_refs: tuple, context: SubmitContext) -> PendingDecision: ...

    def observe(self, feedback: ChunkFeedback) -> None: ...

    def mixture(self, chunk_id: int) -> dict[str, float] | None:
        """The domain weights chunk ``chunk_id`` is drawn with (mixers); None: not a mixer."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def actors(self) -> dict[str, list[Any]]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Decided:
    """A decision available at once."""

    decision: ChunkDecision

    def result(self, timeout_s: float | None) -> ChunkDecision:
        return self.decision


class StatelessBase:
    """Defaults for a component without state or actors (schedulers, mixers); override what applies."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None

    def actors(self) -> dict[str, list[Any]]:
        return {}

    def close(self) -> None:
        return None


class SchedulerBase(StatelessBase):
    """Defaults of the protocol for schedulers without feedback, mixture, state or actors."""

    def observe(self, feedback: ChunkFeedback) -> None:
        return None

    def mixture(self, chunk_id: int) -> dict[str, float] | None:
        return None


def random_order(chunk_len: int, seed: int, chunk_id: int, order_seed: int = 0) -> tuple[int, ...]:
    """The baseline's order: a uniform permutation seeded by ``(seed, chunk_id)`` (and ``order_seed``
    when it is not 0: another order of the same run)."""
    key = [seed, chunk_id] if order_seed == 0 else [seed, chunk_id, order_seed]
    return tuple(int(i) for i in np.random.default_rng(key).permutation(chunk_len))
