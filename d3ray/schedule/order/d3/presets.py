"""D3's two configurations: the no-argument run's (``d3``, the potential sorted where the trainers compute it)
and the paper's pipeline (``schedule.type=d3_paper``); ``d3ray schedulers d3`` prints both."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from d3ray.influence.config import InfluenceConfig, SjltSketchConfig
from d3ray.influence.estimators import HutchinsonConfig
from d3ray.schedule.config import ScheduleConfig
from d3ray.schedule.order.d3.config import D3ScheduleConfig
from d3ray.schedule.order.d3.placements import ActorsPlacement, InTrainerPlacement, PlacementConfig
from d3ray.solver import RsrConfig, SolverConfig

#: The no-argument run's D3 (``d3ray.config.FIRST_RUN_SCHEDULE``): the influence defaults (``drift`` with
#: ``residual: none`` and the AdamW step: the exact drift potential f_i = <g_i, w> of an eighth of each batch's
#: sequences, nothing sketched, the order the sort by f), scored by the trainers themselves, each rank an equal
#: share between chunks (``placement: {type: in_trainer}``; under ZeRO 0-2 the potential on the whole module,
#: d3ray/train/scheduling/trainer_potential.py): on a laptop an influence actor shares the trainers' cores, and its work
#: on one lock-step rank holds back every rank; and chunk 0 in stream order (its influence could overlap
#: nothing: the trainers' first step would wait for it; ``schedule.first_chunk``). The GPU configs in
#: jobs/configs/ name ``placement: {type: actors, num_gpus: ...}``; on a CPU box
#: ``--schedule.placement='{type: actors, nice: 19}'`` gives an influence actor at background priority.
NO_ARGUMENT_RUN = D3ScheduleConfig(placement=InTrainerPlacement(), first_chunk="stream")


def _paper_influence() -> InfluenceConfig:
    return InfluenceConfig(estimator=HutchinsonConfig(), preconditioner="none", sketch=SjltSketchConfig(k=3500))


#: The keys ``d3_paper`` sets, with their values as ``d3ray schedulers d3`` prints them and the run's log
#: compares them (a getter on the config, the value shown).
PAPER_KEYS: dict[str, tuple] = {
    "schedule.influence.estimator.type": (lambda c: c.influence.estimator.type_name, "hutchinson"),
    "schedule.influence.preconditioner": (lambda c: c.influence.preconditioner, "none"),
    "schedule.influence.sketch.type": (lambda c: c.influence.sketch.type_name, "sjlt"),
    "schedule.influence.sketch.k": (lambda c: getattr(c.influence.sketch, "k", None), 3500),
    "schedule.L": (lambda c: c.L, 60),
    "schedule.solver.type": (lambda c: c.solver.type_name, "rsr"),
    "schedule.placement.type": (lambda c: c.placement.type_name, "actors"),
    "schedule.staleness": (lambda c: c.staleness, 1),
    "schedule.first_chunk": (lambda c: c.first_chunk, "stream"),
}


@ScheduleConfig.register("d3_paper")
@dataclass(frozen=True, kw_only=True)
class D3PaperScheduleConfig(D3ScheduleConfig):
    """D3 as the paper runs it: second-order influence with the Hutchinson diagonal Hessian and the plain
    step −γ·∇ℓ, sketched (JL, k = 3500), L = 60, ordered by Random-Swap Refinement (RSR), influence and
    solver actors one chunk ahead. One chunk ahead, chunk 0 has no chunk to overlap: it trains in stream
    order while chunk 1 is scored (``first_chunk: stream``; ``scored`` makes the trainers' first step wait for
    chunk 0's influence, 5 s a run at L = 60 on the 2-core box, docs/results/bench-pipeline-default-d3-2026-12-05.md).

    Every other key is d3's. A key given on top overrides the preset, and the run's log (and every schedule
    log row's ``preset_departures``) names the preset keys it no longer holds, e.g. ``--schedule.solver.type=ils``
    (iterated local search: a stronger solver than the paper's RSR, d3ray/solver/README.md). A key that
    contradicts the preset is refused: a placement other than actors (the paper's estimator needs a double
    backward on whole parameters, in actors), or an estimator whose S is a potential (its order is a sort:
    RSR would search nothing; use ``schedule.type=d3``).
    """

    paper = "Xu et al. 2026, Dynamic Directional Graph-Constrained Data Scheduling (arXiv 2605.31164), §3-4"

    L: int = 60
    influence: InfluenceConfig = field(default_factory=_paper_influence)
    solver: SolverConfig = field(default_factory=RsrConfig)
    placement: PlacementConfig = field(default_factory=ActorsPlacement)
    first_chunk: Literal["scored", "stream"] = "stream"

    def __post_init__(self) -> None:
        if self.placement.type_name != PAPER_KEYS["schedule.placement.type"][1]:
            raise ValueError(f"schedule.type=d3_paper computes influence in actors one chunk ahead; "
                             f"schedule.placement.type={self.placement.type_name} contradicts it (the trainers "
                             f"score the drift potential: schedule.type=d3)")
        if self.orders_by_potential:
            raise ValueError(f"schedule.type=d3_paper searches with schedule.solver.type={self.solver.type_name}, but "
                             f"schedule.influence.estimator={self.influence.estimator.describe()} with preconditioner "
                             f"{self.influence.preconditioner} gives a potential, whose order is its sort: use "
                             f"schedule.type=d3")
        super().__post_init__()

    def preset_departures(self) -> list[str]:
        out = []
        for key, (get, value) in PAPER_KEYS.items():
            if get(self) != value:
                out.append(f"{key}={get(self)} (paper: {value})")
        return out
