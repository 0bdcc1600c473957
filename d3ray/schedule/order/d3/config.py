"""``schedule: {type: d3, ...}``: D3's config: the influence estimator, the solver, and where the influence
runs (``placement``, a typed choice: d3ray/schedule/order/d3/placements/)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from d3ray.influence.config import InfluenceConfig
from d3ray.schedule.config import ScheduleConfig
from d3ray.schedule.order.d3.placements import ActorsPlacement, PlacementConfig
from d3ray.schedule.scheduler import ActorRequest, BuildContext, Kind, TrainerRequests
from d3ray.solver import IlsConfig, SolverConfig
from d3ray.solver.pool import SolverPoolConfig

#: Keys D3 no longer has, with the key that replaced each (a config that names one is refused in one line).
REPLACED_KEYS: dict[str, str] = {
    "influence_placement": "placement: {type: in_trainer|actors, ...}",
    "influence_actors": "placement.count (placement: {type: actors, count: N})",
    "influence_num_cpus": "placement.num_cpus (placement: {type: actors, num_cpus: N})",
    "influence_num_gpus": "placement.num_gpus (placement: {type: actors, num_gpus: N})",
    "influence_resources": "placement.resources (placement: {type: actors, resources: {...}})",
    "influence_max_restarts": "placement.max_restarts (placement: {type: actors, max_restarts: N})",
    "influence_nice": "placement.nice (placement: {type: actors, nice: N})",
    "influence_idle": "placement.idle (placement: {type: actors, idle: true})",
    "snapshot_dtype": "placement.snapshot_dtype (placement: {type: actors, snapshot_dtype: float32})",
}


@ScheduleConfig.register("d3")
@dataclass(frozen=True, kw_only=True)
class D3ScheduleConfig(ScheduleConfig):
    """D3, by default an order by the AdamW drift potential: each chunk sorted by f_i, no search (the paper's
    pipeline is ``d3_paper``).

    Xu et al. 2026, §3 order each chunk of L batches by the directional advantage S of its batches'
    influence. With the influence defaults (``drift``, ``residual: none``, the AdamW step) S is the exact
    drift potential alone, S[i, j] = η·(f_j − f_i) (d3ray/influence/potential.py, eq. P3): the L numbers f_i
    are sorted where they are (the LOP's optimum, no S shipped, no solver; docs/design/d3-default-order.md).
    An estimator that sketches, or ``solver: exact``, gets S and the solver pool. Where f (or S) is computed
    is ``placement``. ``d3ray schedulers d3`` lists the presets and the placements.
    """

    kind = Kind.ORDER
    paper = "Xu et al. 2026, Dynamic Directional Graph-Constrained Data Scheduling (arXiv 2605.31164)"
    replaced_keys: ClassVar[dict[str, str]] = REPLACED_KEYS

    influence: InfluenceConfig = field(default_factory=InfluenceConfig)
    """Estimator, sketch, γ and cost knobs (sample_fraction, param_filter)."""
    solver: SolverConfig = field(default_factory=IlsConfig)
    """Ordering solver (``type: ils | rsr | row_sum | greedy_insertion | exact``)."""
    solver_seed: int = 0
    """Seed of the solver (combined with the chunk id)."""
    solver_pool: SolverPoolConfig = field(default_factory=lambda: SolverPoolConfig(num_cpus=0.25))
    """Solver actors: count, CPUs, custom resources (pin to CPU nodes), restarts."""
    placement: PlacementConfig = field(default_factory=ActorsPlacement)
    """Where a chunk's influence is computed: ``{type: in_trainer}`` (the trainer ranks, between chunks) or
    ``{type: actors, num_gpus, ...}`` (influence actors, one chunk ahead). ``in_trainer`` is the no-argument
    run's: the ranks score each next chunk themselves, no weights move. ``actors`` (the class default, the GPU
    configs'): influence actors with a full model replica each, ``{type: actors, count, num_cpus, num_gpus,
    resources, nice, idle, max_restarts, snapshot_dtype}``: give them a GPU share. The schedule log's
    ``influence_placement`` says which one a run used (d3ray/schedule/order/d3/placements/)."""
    save_matrices: bool = False
    """Write each chunk's S under ``<run_dir>/influence/S_<chunk>.npy`` (trainer rank 0; for the
    potential, S = η·(f_j − f_i) is built for it). Off by default: the schedule log already holds what
    decided each chunk (``potential``: the L numbers f of a sort), and the files cost the trainers time."""
    first_chunk: Literal["scored", "stream"] = "scored"
    """Chunk 0 of a run: ``scored`` orders it like every chunk, from the initial weights (version 0), and the
    trainers' first step waits for that influence (nothing can overlap it); ``stream`` trains it in stream
    order at once, decided without influence (deterministic, so resume and exactly-once are unchanged; the
    schedule log row says ``first_chunk: stream_order``, not a fallback), and chunk 1 is scored while the
    trainers train chunk 0. The no-argument run uses ``stream`` (d3ray.config.FIRST_RUN_SCHEDULE)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.first_chunk not in ("scored", "stream"):
            raise ValueError(f"schedule.first_chunk={self.first_chunk!r} must be scored or stream")
        self.placement.check_schedule(self)

    def check_train(self, train: object) -> None:
        """The placement's rules on the run's train config (ZeRO stage, ...): ValueError naming the keys."""
        self.placement.check_train(self, train)

    def trainer_requests(self) -> TrainerRequests:
        """What the placement asks of the trainers (a weights snapshot, or their own sketches)."""
        return self.placement.trainer_requests(self)

    @property
    def orders_by_potential(self) -> bool:
        """S is the exact drift potential alone (``drift``, ``residual: none``, the AdamW step): rank 2,
        and its LOP is solved exactly by the sort by f (``d3ray/solver/potential.py``), no search."""
        estimator = self.influence.estimator
        return (not estimator.is_exact_lookahead and estimator.exact_potential
                and self.influence.needs_optimizer_state and not estimator.sketches_residual)

    @property
    def sorts_potential(self) -> bool:
        """The order is the sort of the potential f (:attr:`orders_by_potential`; every solver but the
        ``exact`` reference finds that sort anyway, d3ray/solver/potential.py): no S is built and no
        solver runs; the schedule log says ``decided_by: sorted by potential, no search``."""
        return self.orders_by_potential and self.solver.type_name != "exact"

    def unused_keys(self) -> list[str]:
        """Keys set away from their default that this config does not use (the run's log names them):
        a search solver when the order is the sort of the potential."""
        if self.sorts_potential and self.solver != IlsConfig():
            return [f"schedule.solver.type={self.solver.type_name} (schedule.influence gives the drift potential "
                    f"alone: the order is its sort, no search)"]
        return []

    def preset_departures(self) -> list[str]:
        """The keys of a preset this config no longer holds (none for plain ``d3``)."""
        return []

    def actor_requests(self) -> list[ActorRequest]:
        """The placement's actors, and the solver pool unless the order is the sort of f."""
        solver = ActorRequest("solver", self.solver_pool.num_actors,
                              {"CPU": self.solver_pool.num_cpus, **self.solver_pool.resources})
        return [*self.placement.actor_requests(self), *([] if self.sorts_potential else [solver])]

    def build(self, ctx: BuildContext):
        from d3ray.schedule.order.d3.scheduler import D3Scheduler

        return D3Scheduler(self, ctx)
