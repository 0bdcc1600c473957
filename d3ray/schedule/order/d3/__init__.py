"""D3: each chunk of L batches ordered by its batches' influence (Xu et al. 2026, §3). Registers
``schedule.type=d3`` and ``d3_paper`` and the placements on import (cheap: no torch, no Ray).

    config.py          D3ScheduleConfig: influence, solver, solver pool, placement, first_chunk
    presets.py         the no-argument run's D3 (NO_ARGUMENT_RUN) and the paper's (d3_paper, PAPER_KEYS)
    placements/        where a chunk's influence is computed, one file each: actors.py, in_trainer.py
                       (base.py: what a placement declares: checks, trainer requests, actors, build)
    scheduler.py       D3Scheduler: chunk 0 in stream order or the placement's submitter; its actors, close
    decisions.py       the decision of a chunk: the sort of f, the solver's search of S, or the fallback
    influence_actor.py the actors placement's InfluenceWorker and the tasks that join its parts

``D3Scheduler.submit`` has no placement branch: a placement builds the object that submits a chunk.
"""

from d3ray.schedule.order.d3.config import D3ScheduleConfig
from d3ray.schedule.order.d3.placements import ActorsPlacement, InTrainerPlacement, PlacementConfig
from d3ray.schedule.order.d3.presets import NO_ARGUMENT_RUN, PAPER_KEYS, D3PaperScheduleConfig

__all__ = ["ActorsPlacement", "D3PaperScheduleConfig", "D3ScheduleConfig", "InTrainerPlacement", "NO_ARGUMENT_RUN",
           "PAPER_KEYS", "PlacementConfig"]
