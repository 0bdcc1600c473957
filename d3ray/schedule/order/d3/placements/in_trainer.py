"""``placement: {type: in_trainer}``: the trainer ranks score each next chunk themselves between chunks, each
rank an equal share, and no weights move; the coordinator gets the chunk's f (or S) from them.

    trainers, between chunks (d3ray/train/scheduling/trainer_side.py, a SketchRequest):
      ZeRO 0-2, the potential alone: f on the whole module (d3ray/train/scheduling/trainer_potential.py)
      ZeRO-3: sketches on the parameter shards, merged into S on rank 0 (d3ray/train/scheduling/sharded_influence.py)
    submit(chunk): the trainers' f ─► sorted here and now (no S, no solver, no actor), or their S ─► the solver pool

It costs trainer time, but where an actor would share the trainers' cores (a CPU box) that is cheaper
than the actor: its work lands on one lock-step rank, and the others wait for it
(docs/design/d3-default-order.md). The no-argument run's placement (``d3ray.config.FIRST_RUN_SCHEDULE``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from d3ray.schedule.order.d3.placements.base import PlacementConfig
from d3ray.schedule.scheduler import SketchRequest, TrainerRequests

if TYPE_CHECKING:
    import numpy as np

    from d3ray.data.chunker import Chunk
    from d3ray.schedule.order.d3.config import D3ScheduleConfig
    from d3ray.schedule.scheduler import BuildContext, PendingDecision, SubmitContext
    from d3ray.solver.pool import SolverPool


@PlacementConfig.register("in_trainer")
@dataclass(frozen=True, kw_only=True)
class InTrainerPlacement(PlacementConfig):
    """The trainer ranks score each next chunk themselves between chunks, an equal share each: no actor, no
    weights snapshot, no keys (the module docstring draws it)."""

    def check_schedule(self, d3: D3ScheduleConfig) -> None:
        """The estimator must run on parameter shards (``InfluenceConfig.check_shardable``): ValueError naming it."""
        d3.influence.check_shardable()

    def check_train(self, d3: D3ScheduleConfig, train: Any) -> None:
        """Anything but the drift potential alone is sketched on ZeRO-3 parameter shards: ``train.zero_stage``
        must be 3 (under ZeRO 0-2 the ranks compute the potential alone on their whole module)."""
        if train.zero_stage != 3 and not d3.influence.potential_alone:
            raise ValueError(f"schedule.placement.type=in_trainer sketches on ZeRO-3 parameter shards: set "
                             f"--train.zero_stage=3 (got {train.zero_stage}), or use schedule.placement.type=actors "
                             f"(under ZeRO 0-2 the trainers compute the drift potential alone: drift, residual "
                             f"none, potential step or jvp)")

    def trainer_requests(self, d3: D3ScheduleConfig) -> TrainerRequests:
        """The trainers score each chunk due (no weights move)."""
        return TrainerRequests(sketch=SketchRequest(influence=d3.influence, staleness=d3.staleness, L=d3.L,
                                                    first_chunk_scored=d3.first_chunk == "scored"))

    def build(self, d3: D3ScheduleConfig, ctx: BuildContext, solver_pool: SolverPool | None) -> InTrainerSubmitter:
        return InTrainerSubmitter(d3, solver_pool, ctx.seed)


def take_trainer_influence(batch_ids: list[int], influence: Any) -> tuple[np.ndarray | None, dict[str, Any]]:
    """(S or f, info) from the trainers' ChunkInfluence (S) or ChunkPotential (f), checked against the chunk's
    batch ids (a mismatch gives None and ``info["error"]``: the chunk falls back)."""
    values = getattr(influence, "S", None)
    if values is None:
        values = influence.potential
    info: dict[str, Any] = {"influence_sec": float(influence.timings.get("influence/total_sec", 0.0)),
                            "influence_bytes": int(values.nbytes + influence.losses.nbytes)}
    if list(influence.batch_ids) != list(batch_ids):
        return None, {**info, "error": f"trainer influence is for batches {influence.batch_ids}, not {batch_ids}"}
    info["excluded_batches"] = [int(b) for b in influence.excluded]
    return values, info


class InTrainerSubmitter:
    """Decides each chunk from the trainers' f or S (see the module docstring); made by :meth:`InTrainerPlacement.build`."""

    def __init__(self, d3: D3ScheduleConfig, solver_pool: SolverPool | None, seed: int) -> None:
        self.cfg, self.solver_pool, self.seed = d3, solver_pool, seed

    def submit(self, chunk: Chunk, batch_refs: Any, context: SubmitContext) -> PendingDecision:
        import numpy as np
        import ray

        from d3ray.schedule.order.d3.decisions import (
            base_record,
            chunk_refs,
            fallback,
            potential_decision,
            submit_solve,
            unsearchable,
        )
        from d3ray.schedule.scheduler import Decided
        from d3ray.solver.potential import potential_matrix

        if context.influence is None:
            return Decided(fallback(chunk, None, "no influence from the trainers in time"))
        chunk_refs(chunk, batch_refs)  # the trainers hold the batches; the refs only say there are L of them
        L, ids = chunk.size, list(chunk.batch_ids)
        started = time.perf_counter()
        payload = ray.get(context.influence[0])  # the trainers' f (or S) of the whole chunk: a few hundred bytes
        values, info = take_trainer_influence(ids, payload)
        if values is None:
            return Decided(fallback(chunk, None, info["error"]))
        if self.cfg.sorts_potential:  # the sort of f, here and now: no S, no solver (docs/design/d3-default-order.md)
            return Decided(potential_decision(self.cfg, chunk.chunk_id, ids, payload, info, started))
        if getattr(payload, "S", None) is None and np.shape(values) == (L,):  # f for the exact reference solver
            values = potential_matrix(values, np.isin(ids, payload.excluded), payload.step_size)
        problem = unsearchable(values, L)
        if problem is not None:
            return Decided(fallback(chunk, None, f"chunk {chunk.chunk_id}: S cannot be searched ({problem}); "
                                                 f"stream order", base_record(self.cfg)))
        return submit_solve(self.cfg, chunk.chunk_id, L, ray.put(values), ray.put(info), self.solver_pool,
                            self.seed, started)

    def influence_actors(self) -> list[Any]:
        return []  # the trainers score: no influence actor

    def close(self) -> None:
        return None
