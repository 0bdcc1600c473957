"""Where D3's influence runs: the placement, a typed choice (``schedule.placement: {type: NAME, ...}``).

A placement is one registered config class in one file of this folder. It declares, before anything
starts, everything D3 needs to know about where a chunk's influence is computed:

    PlacementConfig (registered: actors, in_trainer)
        check_schedule(d3)     its own rules on the D3 config (an estimator it cannot run, ...): ValueError
        check_train(d3, train) its rules on the run's train config (ZeRO stage, world size, ...): ValueError
        trainer_requests(d3)   what it asks of the trainers (a weights snapshot, or their own sketches)
        actor_requests(d3)     the Ray actors it starts (the solver pool is D3's, not the placement's)
        build(d3, ctx, pool)   ─► a ChunkSubmitter, which D3Scheduler.submit calls for every scored chunk

A new placement (an influence worker group for a 70B model, say) is a new file here that registers a
config class with these five methods: ``D3Scheduler`` does not change (tests/unit/test_d3_placements.py
registers one in the test module).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from d3ray.registry import ChoiceConfig
from d3ray.schedule.scheduler import ActorRequest, TrainerRequests

if TYPE_CHECKING:
    from d3ray.data.chunker import Chunk
    from d3ray.schedule.order.d3.config import D3ScheduleConfig
    from d3ray.schedule.scheduler import BuildContext, PendingDecision, SubmitContext
    from d3ray.solver.pool import SolverPool


class ChunkSubmitter(Protocol):
    """What a placement builds: it starts one chunk's influence (and its order) where the placement says."""

    def submit(self, chunk: Chunk, batch_refs: Any, context: SubmitContext) -> PendingDecision:
        """Start the influence of ``chunk`` (its ``L`` batch refs, in stream order); return its pending decision.
        Chunk 0 in stream order (``first_chunk: stream``) never gets here: D3Scheduler decides it."""
        ...

    def influence_actors(self) -> list[Any]:
        """The Ray actors it started (``placement.json``'s ``influence``; none for the trainers themselves)."""
        ...

    def close(self) -> None:
        """Stop what it started."""
        ...


@dataclass(frozen=True, kw_only=True)
class PlacementConfig(ChoiceConfig):
    """Where the influence of a chunk is computed (``schedule.placement.type``); see the module docstring."""

    def check_schedule(self, d3: D3ScheduleConfig) -> None:
        """Raise ValueError (naming the keys) for a D3 config this placement cannot run. None here."""
        return None

    def check_train(self, d3: D3ScheduleConfig, train: Any) -> None:
        """Raise ValueError (naming the keys) for a train config (``TrainConfig``) this placement cannot run
        beside. None here."""
        return None

    def trainer_requests(self, d3: D3ScheduleConfig) -> TrainerRequests:
        """What the trainers do for this placement (d3ray/train/scheduling/trainer_side.py carries it out)."""
        return TrainerRequests()

    def actor_requests(self, d3: D3ScheduleConfig) -> list[ActorRequest]:
        """The Ray actors this placement starts (sweep accounting, preflight, ``placement.json``)."""
        return []

    def build(self, d3: D3ScheduleConfig, ctx: BuildContext, solver_pool: SolverPool | None) -> ChunkSubmitter:
        """The object that submits each scored chunk (``solver_pool``: D3's, None when the order is a sort)."""
        raise NotImplementedError(f"schedule.placement.type={self.type_name!r} has no build()")
