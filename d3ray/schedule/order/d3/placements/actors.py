"""``placement: {type: actors, ...}``: influence actors, each with a full model replica, score chunk c + 1
while the trainers train chunk c, from a weights snapshot the trainers publish every chunk.

    trainers ── snapshot of version v (dtype ``snapshot_dtype``, with the AdamW state for ``adam``) ──┐
    submit(chunk) ── the chunk's batch refs split over the ``count`` actors (refs, not bytes):         ▼
      potential alone, one actor:     order_chunk ─► f ─► PotentialPending (the coordinator sorts f)
      potential alone, several:       shares of f ─► assemble_potential ─► PotentialPending
      anything that sketches or steps: sketch_chunk / lookahead_chunk ─► assemble_influence ─► S
                                       ─► the solver pool ─► D3Pending

The production placement on GPU clusters (give the actors a GPU share, ``num_gpus``), the class default
of ``D3ScheduleConfig`` and the paper's (``schedule.type=d3_paper``). On CPU nodes shared with the
trainers they run at a background niceness (``nice``) so that the trainers keep the cores.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from d3ray.schedule.order.d3.placements.base import PlacementConfig
from d3ray.schedule.scheduler import SNAPSHOT_DTYPES, ActorRequest, SnapshotRequest, TrainerRequests

if TYPE_CHECKING:
    from d3ray.data.chunker import Chunk
    from d3ray.schedule.order.d3.config import D3ScheduleConfig
    from d3ray.schedule.scheduler import BuildContext, PendingDecision, SubmitContext
    from d3ray.solver.pool import SolverPool


@PlacementConfig.register("actors")
@dataclass(frozen=True, kw_only=True)
class ActorsPlacement(PlacementConfig):
    """Influence actors, each with a full model replica, score each next chunk from the weights snapshot the
    trainers publish every chunk, one chunk ahead and asynchronously (the module docstring draws it)."""

    count: int = 1
    """InfluenceWorker actors; a chunk's batches are split across them."""
    num_cpus: float = 1.0
    """CPUs per influence actor."""
    num_gpus: float = 0.0
    """GPUs per influence actor (fractional allowed, e.g. 0.25 to share a GPU with a trainer)."""
    resources: dict[str, float] = field(default_factory=dict)
    """Custom resources per influence actor (e.g. {"gpu_node": 0.01})."""
    max_restarts: int = 2
    """Restarts of a crashed influence actor (its in-flight task is retried on the new one)."""
    nice: int = 0
    """OS niceness (0-19) influence actors run at, at least: raised to it, never lowered (Ray starts its
    workers, trainers included, at 15). On CPU nodes shared with the trainers, 19 gives the trainers
    the larger share of the cores: influence latency grows (hidden by staleness 1) and the training
    steps it overlaps slow down less; 0 leaves Ray's value."""
    idle: bool = False
    """Run the influence actors' task thread under Linux's ``SCHED_IDLE`` policy (on top of ``nice``; Ray's
    own threads keep theirs): it takes a core only when no trainer thread wants it, i.e. while a trainer
    waits (at the all-reduce, for data, for I/O). Measured no better than niceness 19 on the 2-core box
    (docs/results/). Influence latency then depends on the trainers' idle time: an order not ready when
    the trainers need it makes them wait (``deadline_s``, then the fallback). Linux only (elsewhere: a
    warning, and the niceness alone)."""
    snapshot_dtype: str = "bfloat16"
    """The dtype of the weights snapshot (and AdamW m, v) the trainers publish every chunk for the
    influence actors: ``bfloat16`` or ``float32``. ``bfloat16`` halves the bytes each chunk moves through
    the object store; the actors compute in ``influence.dtype`` either way, so only the snapshot is rounded
    (to 8 significant bits): ``d3ray bench influence --snapshot-dtype`` measures what that does to S and
    the order (d3ray/influence/README.md, "Snapshot dtype"). ``float32`` ships exact copies."""

    def __post_init__(self) -> None:
        if self.snapshot_dtype not in SNAPSHOT_DTYPES:
            raise ValueError(f"schedule.placement.snapshot_dtype={self.snapshot_dtype!r} must be one of "
                             f"{', '.join(SNAPSHOT_DTYPES)}")
        if not 0 <= self.nice <= 19:
            raise ValueError(f"schedule.placement.nice={self.nice} must be in 0..19")
        if self.count < 1:
            raise ValueError(f"schedule.placement.count={self.count} must be >= 1")

    def sorts_in_actor(self, d3: D3ScheduleConfig) -> bool:
        """One actor and the order a sort of f (``D3ScheduleConfig.sorts_potential``): that actor computes and
        hands over f itself; no merge task and no solver actor: one hop per chunk instead of three."""
        return self.count == 1 and d3.sorts_potential

    def trainer_requests(self, d3: D3ScheduleConfig) -> TrainerRequests:
        """A weights snapshot per chunk, with the AdamW state for ``preconditioner: adam``; at staleness 1
        published after the boundary's checkpoint (the actor's work then does not overlap the save and
        Ray Train's report)."""
        return TrainerRequests(snapshot=SnapshotRequest(dtype=self.snapshot_dtype,
                                                        optimizer_state=d3.influence.needs_optimizer_state,
                                                        staleness=d3.staleness))

    def actor_requests(self, d3: D3ScheduleConfig) -> list[ActorRequest]:
        return [ActorRequest("influence", self.count,
                             {"CPU": self.num_cpus, "GPU": self.num_gpus, **self.resources})]

    def build(self, d3: D3ScheduleConfig, ctx: BuildContext, solver_pool: SolverPool | None) -> ActorsSubmitter:
        """Start the ``count`` influence actors (their own resources, never a Tune trial's placement group,
        which holds only its driver)."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from d3ray.schedule.order.d3.influence_actor import ChunkInfluenceWorker

        opts: dict[str, Any] = dict(num_cpus=self.num_cpus, max_restarts=self.max_restarts,
                                    max_task_retries=self.max_restarts,
                                    scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=None))
        if self.num_gpus:
            opts["num_gpus"] = self.num_gpus
        if self.resources:
            opts["resources"] = dict(self.resources)
        remote = ray.remote(ChunkInfluenceWorker)
        actors = [remote.options(name=f"d3ray:{ctx.run_name}:influence:{i}", get_if_exists=False, **opts)
                  .remote(ctx.model_config, d3.influence, ctx.run_dir, i, self.nice, ctx.model.lora,
                          ctx.model.attn_implementation, self.idle, self.sorts_in_actor(d3))
                  for i in range(self.count)]
        return ActorsSubmitter(d3, actors, solver_pool, ctx.seed)


class ActorsSubmitter:
    """Submits each chunk to the influence actors (see the module docstring); made by :meth:`ActorsPlacement.build`."""

    def __init__(self, d3: D3ScheduleConfig, actors: list[Any], solver_pool: SolverPool | None, seed: int) -> None:
        import ray

        from d3ray.schedule.order.d3.influence_actor import (
            assemble_influence,
            assemble_potential,
            sketches_anything,
        )

        self.cfg, self.actors, self.solver_pool, self.seed = d3, list(actors), solver_pool, seed
        self._sorts_in_actor = d3.placement.sorts_in_actor(d3)
        self._reference: list | None = None
        # Only a pool of several influence workers that sketch something needs a shared control-variate
        # reference (the default, drift with residual none, sketches nothing: no reference, no means shipped).
        self._sketches = sketches_anything(d3.influence)
        self._keeps_reference = (len(self.actors) > 1 and d3.influence.control_variate
                                 and not d3.influence.estimator.is_exact_lookahead and self._sketches)
        # the Ray task that joins the actors' parts: into f (the potential alone) or into S
        self._assemble = ray.remote(num_cpus=0, max_retries=2)(
            assemble_potential if d3.sorts_potential else assemble_influence)

    def submit(self, chunk: Chunk, batch_refs: Any, context: SubmitContext) -> PendingDecision:
        import numpy as np

        from d3ray.schedule.order.d3.decisions import PotentialPending, chunk_refs, fallback, submit_solve
        from d3ray.schedule.scheduler import Decided

        if context.weights is None:
            return Decided(fallback(chunk, None, "no weights snapshot published in time"))
        refs = chunk_refs(chunk, batch_refs)
        L, ids, actors, weights = chunk.size, list(chunk.batch_ids), self.actors, context.weights
        started = time.perf_counter()
        if self._sorts_in_actor:
            info_ref, potential_ref = actors[0].order_chunk.options(num_returns=2).remote(
                chunk.chunk_id, weights, refs, ids)
            return PotentialPending(self.cfg, chunk.chunk_id, ids, info_ref, potential_ref, started)
        if self.cfg.influence.estimator.is_exact_lookahead:
            parts = [a.lookahead_chunk.remote(chunk.chunk_id, weights, refs, ids, ids[k::len(actors)])
                     for k, a in enumerate(actors) if ids[k::len(actors)]]
        else:  # several workers share a chunk only once a common reference (the last chunk's) exists
            shared = len(actors) > 1 and (self._reference is not None or not self._sketches)
            splits = np.array_split(np.arange(L), len(actors)) if shared else [np.arange(L)]
            parts = [actors[k].sketch_chunk.remote(chunk.chunk_id, weights, [refs[i] for i in part],
                                                   [ids[i] for i in part], self._reference if shared else None,
                                                   self._keeps_reference)
                     for k, part in enumerate(splits) if len(part)]
        if self.cfg.sorts_potential:  # several actors' shares of f, joined in one task, sorted by the coordinator
            info_ref, potential_ref = self._assemble.options(num_returns=2).remote(ids, *parts)
            return PotentialPending(self.cfg, chunk.chunk_id, ids, info_ref, potential_ref, started)
        S_ref, info_ref, next_reference = self._assemble.options(num_returns=3).remote(
            self.cfg.influence.estimator, ids, *parts)
        if self._keeps_reference:
            self._reference = [next_reference]  # the next chunk's reference: this chunk's mean directions
        return submit_solve(self.cfg, chunk.chunk_id, L, S_ref, info_ref, self.solver_pool, self.seed, started)

    def influence_actors(self) -> list[Any]:
        return list(self.actors)

    def close(self) -> None:
        import ray

        for actor in self.actors:
            ray.kill(actor)
