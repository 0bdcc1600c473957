"""The D3 scheduler: a chunk's influence computed where its placement says, one chunk ahead of the trainers,
ordered by the sort of its potential or a solver's search, or a fallback past the deadline.

    submit(chunk, batch refs, context) — called by the coordinator when it produces a chunk; returns at once
      chunk 0 with ``first_chunk: stream``: decided in stream order now, without influence (``first_chunk:
        stream_order`` in its log row), so the first step never waits
      any other chunk: the placement's submitter (``schedule.placement``, d3ray/schedule/order/d3/placements/):
        actors      the influence actors score it from the weights snapshot (``influence_actor.py``)
        in_trainer  the trainers scored it; their f is sorted here, their S goes to the solver pool
    PendingDecision.result(deadline) — called when the trainers need the chunk (``decisions.py``):
      the sorted or solved order; or, past the deadline / on failure, the fallback: row_sum(S) when S
      exists (the solver's initial order), else the stream order. Recorded as ``fallback``.

The potential alone (``drift``, ``residual: none``, the AdamW step: ``D3ScheduleConfig.sorts_potential``)
needs no solver: S[i, j] = η·(f_j − f_i) is ordered exactly by the sort of f (the LOP's optimum,
``d3ray/solver/potential.py``), so no solver pool is started; its log row says ``decided_by: sorted by
potential, no search`` (docs/design/d3-default-order.md).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from d3ray.data.chunker import Chunk
from d3ray.schedule.order.d3.decisions import base_record
from d3ray.schedule.scheduler import (
    BuildContext,
    ChunkDecision,
    Decided,
    PendingDecision,
    SchedulerBase,
    SubmitContext,
)

if TYPE_CHECKING:  # config imports this module in D3ScheduleConfig.build: a type only, no import circle
    from d3ray.schedule.order.d3.config import D3ScheduleConfig

logger = logging.getLogger(__name__)


class D3Scheduler(SchedulerBase):
    """Owns a run's D3 submitter (its placement's actors) and the solver pool (created in the driver, used by
    the coordinator)."""

    def __init__(self, cfg: D3ScheduleConfig, ctx: BuildContext) -> None:
        self.cfg = cfg
        # The potential alone: its order is the sort of f, made where f is (no S, no solver actor).
        self.solver_pool = None if cfg.sorts_potential else cfg.solver_pool.build(cfg.solver, run_dir=ctx.run_dir)
        self.submitter = cfg.placement.build(cfg, ctx, self.solver_pool)
        for key in cfg.unused_keys() + cfg.preset_departures():
            logger.warning("schedule: %s", key if "(paper:" not in key else f"the d3_paper preset no longer holds {key}")

    def submit(self, chunk: Chunk, batch_refs: tuple, context: SubmitContext) -> PendingDecision:
        L = chunk.size
        if chunk.chunk_id == 0 and self.cfg.first_chunk == "stream":
            # Decided at once, without influence: the trainers' first step does not wait (D3ScheduleConfig.first_chunk).
            return Decided(ChunkDecision(order=tuple(range(L)), fallback=False,
                                         record={**base_record(self.cfg), "first_chunk": "stream_order"}))
        return self.submitter.submit(chunk, batch_refs, context)

    def actors(self) -> dict[str, list[Any]]:
        solvers = {} if self.solver_pool is None else {"solver": list(self.solver_pool.actors)}
        return {"influence": self.submitter.influence_actors(), **solvers}

    def close(self) -> None:
        if self.solver_pool is not None:
            self.solver_pool.shutdown()
        self.submitter.close()


__all__ = ["D3Scheduler"]
