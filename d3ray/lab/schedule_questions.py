"""The questions the lab's studies ask of a schedule config, answered in the lab, not on the configs.

``d3ray compare`` asks whether an arm's chunks are ordered by D3 influence (such an arm is a method, the
others baselines) and how many influence actors one chunk's ``influence_sec`` stands for (its compute
accounting); ``d3ray census`` asks whether a run's every decision is a permutation of the chunk's stream
batches (then any other order of the same batches is a counterfactual of the same chunk, what it
branches). The product never asks them, so they are no part of ``ScheduleConfig``: two are a table
here, keyed by config class, and one is derived from what a config already declares (its actors).
"""

from __future__ import annotations

from dataclasses import dataclass

from d3ray.schedule.config import ScheduleConfig, StagedScheduleConfig


@dataclass(frozen=True)
class StudyRow:
    """What the studies need to know of one scheduler's config class."""

    orders_by_influence: bool
    """Its chunks are ordered by D3 influence (Xu et al. 2026, §3): ``d3ray compare`` counts it a method."""
    permutes_stream_batches: bool
    """Every decision is a permutation of the chunk's stream batches (no selection, re-batching, mixing or
    weights): ``d3ray census`` can branch its runs."""


#: The table, keyed by config class through the name it is registered under (``schedule.type``), so that a
#: class moving between files changes nothing here. A class answers with the row of the nearest class in
#: its method resolution order that has one (``d3_paper`` with ``d3``'s); a class without one answers
#: :data:`NO_ROW`. A staged scheduler (select, weight, mix) has no row of its own: it trains what it keeps,
#: not the stream's batches, and its order question goes to its ``order`` stage.
STUDY_TABLE: dict[str, StudyRow] = {
    "sequential": StudyRow(orders_by_influence=False, permutes_stream_batches=True),
    "random": StudyRow(orders_by_influence=False, permutes_stream_batches=True),
    "d3": StudyRow(orders_by_influence=True, permutes_stream_batches=True),
}
NO_ROW = StudyRow(orders_by_influence=False, permutes_stream_batches=False)


def study_row(config: ScheduleConfig | type[ScheduleConfig]) -> StudyRow:
    """The table's row of a config (or config class): its own class's, else its nearest base's, else none."""
    cls = config if isinstance(config, type) else type(config)
    for klass in cls.__mro__:
        name = vars(klass).get("type_name")  # set on the class itself when it registers
        if name in STUDY_TABLE:
            return STUDY_TABLE[name]
    return NO_ROW


def orders_by_influence(schedule: ScheduleConfig) -> bool:
    """Whether the run's chunks are ordered by D3 influence: this scheduler's own order, or its ``order``
    stage's for a select, weight or mix scheduler (``{type: odm, order: {type: d3}}`` is)."""
    if isinstance(schedule, StagedScheduleConfig):
        return orders_by_influence(schedule.order)
    return study_row(schedule).orders_by_influence


def permutes_stream_batches(config: ScheduleConfig | type[ScheduleConfig]) -> bool:
    """Whether every decision of the scheduler is a permutation of its chunk's stream batches."""
    return study_row(config).permutes_stream_batches


def census_schedule_types() -> list[str]:
    """The registered ``schedule.type`` names whose runs ``d3ray census`` branches."""
    return [name for name in ScheduleConfig.known() if permutes_stream_batches(ScheduleConfig.lookup(name))]


def influence_actor_count(schedule: ScheduleConfig) -> int:
    """How many influence actors one chunk's ``influence_sec`` (its slowest part) stands for in
    ``d3ray compare``'s compute accounting: the influence actors the config declares it starts (its
    ``actor_requests()``, an order stage's included), or 1 where it starts none (a scheduler without
    influence logs no ``influence_sec``; under ``in_trainer`` the trainers score the chunk, no actor)."""
    declared = sum(request.count for request in schedule.actor_requests() if request.role == "influence")
    return max(declared, 1)
