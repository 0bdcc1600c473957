"""Configs of the order schedulers (registered on import; the schedulers are imported by ``build``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from d3ray.influence.config import InfluenceConfig, SjltSketchConfig
from d3ray.influence.estimators import HutchinsonConfig
from d3ray.schedule.config import ScheduleConfig
from d3ray.schedule.scheduler import (
    SNAPSHOT_DTYPES,
    ActorRequest,
    BuildContext,
    Kind,
    SketchRequest,
    SnapshotRequest,
    TrainerRequests,
)
from d3ray.solver import IlsConfig, RsrConfig, SolverConfig
from d3ray.solver.pool import SolverPoolConfig


@ScheduleConfig.register("d3")
@dataclass(frozen=True, kw_only=True)
class D3ScheduleConfig(ScheduleConfig):
    """D3, by default an order by the AdamW drift potential: each chunk sorted by f_i, no search (the paper's
    pipeline is ``d3_paper``).

    Xu et al. 2026, §3 order each chunk by the directional advantage S of its batches' influence. With the
    defaults (``influence``: ``drift``, ``residual: none``, the AdamW step) S is the exact drift potential
    alone, S[i, j] = η·(f_j − f_i) (d3ray/influence/potential.py, eq. P3): the trainers compute the L
    numbers f_i between chunks and the coordinator sorts them (the LOP's optimum, no S built, no solver,
    no actor; docs/design/d3-default-order.md). An estimator that sketches, or ``solver: exact``, gets S
    and the solver pool. ``d3ray schedulers d3`` lists the presets.
    """

    kind = Kind.ORDER
    paper = "Xu et al. 2026, Dynamic Directional Graph-Constrained Data Scheduling (arXiv 2605.31164)"

    influence: InfluenceConfig = field(default_factory=InfluenceConfig)
    """Estimator, sketch, γ and cost knobs (sample_fraction, param_filter)."""
    solver: SolverConfig = field(default_factory=IlsConfig)
    """Ordering solver (``type: ils | rsr | row_sum | greedy_insertion | exact``)."""
    solver_seed: int = 0
    """Seed of the solver (combined with the chunk id)."""
    solver_pool: SolverPoolConfig = field(default_factory=lambda: SolverPoolConfig(num_cpus=0.25))
    """Solver actors: count, CPUs, custom resources (pin to CPU nodes), restarts."""
    influence_placement: Literal["auto", "actors", "in_trainer"] = "actors"
    """Where the influence of a chunk is computed. ``actors``: InfluenceWorker actors that each hold a
    full model replica, fed a weights snapshot every chunk, one chunk ahead and asynchronously (the
    production placement: give them a GPU share, ``influence_num_gpus``). ``in_trainer``: the trainer
    ranks score the chunk themselves between chunks, each rank an equal share, and no weights move: under
    ZeRO-3 they sketch it on their parameter shards (d3ray/train/sharded_influence.py; no process holds a
    full model); under ZeRO 0-2 they compute the drift potential alone (the default estimator) on their
    whole module (d3ray/train/trainer_potential.py). It costs trainer time, but where an actor would
    share the trainers' cores (a CPU box) that is cheaper than the actor: its work lands on one lock-step
    rank, and the others wait for it (README.md, "Benchmarks"); the influence_* actor fields below are
    then unused. ``auto`` (the no-argument run's): ``in_trainer`` for the drift potential alone
    (``InfluenceConfig.potential_alone``) unless the actors were given resources of their own
    (``influence_num_gpus`` or ``influence_resources``); ``actors`` for anything that sketches or steps.
    The schedule log's ``influence_placement`` says which one a run used."""
    influence_actors: int = 1
    """InfluenceWorker actors; a chunk's batches are split across them."""
    influence_num_cpus: float = 1.0
    """CPUs per influence actor."""
    influence_num_gpus: float = 0.0
    """GPUs per influence actor (fractional allowed, e.g. 0.25 to share a GPU with a trainer)."""
    influence_resources: dict[str, float] = field(default_factory=dict)
    """Custom resources per influence actor (e.g. {"gpu_node": 0.01})."""
    influence_max_restarts: int = 2
    """Restarts of a crashed influence actor (its in-flight task is retried on the new one)."""
    influence_nice: int = 0
    """OS niceness (0-19) influence actors run at, at least: raised to it, never lowered (Ray starts its
    workers, trainers included, at 15). On CPU nodes shared with the trainers, 19 gives the trainers
    the larger share of the cores: influence latency grows (hidden by staleness 1) and the training
    steps it overlaps slow down less; 0 leaves Ray's value."""
    influence_idle: bool = False
    """Run the influence actors' task thread under Linux's ``SCHED_IDLE`` policy (on top of
    ``influence_nice``; Ray's own threads keep theirs): it takes a core only when no trainer thread
    wants it, i.e. while a trainer waits (at the all-reduce, for data, for I/O). Measured no better than
    niceness 19 on the 2-core box (README.md, "Benchmarks"). Influence latency then depends on the trainers' idle time: an order not ready when
    the trainers need it makes them wait (the actor then has the cores; ``deadline_s``, then the
    fallback). Linux only (elsewhere: a warning, and the niceness alone)."""
    save_matrices: bool = False
    """Write each chunk's S under ``<run_dir>/influence/S_<chunk>.npy`` (trainer rank 0; for the
    potential, S = η·(f_j − f_i) is built for it). Off by default: the schedule log already holds what
    decided each chunk (``potential``: the L numbers f of a sort), and the files cost the trainers time."""
    first_chunk: Literal["scored", "stream"] = "scored"
    """Chunk 0 of a run: ``scored`` orders it like every chunk, from the
    initial weights (version 0, which trainer rank 0 publishes before its first step), and the trainers'
    first step waits for that influence + solve (nothing can overlap it: the influence actor starts
    beside the trainers); ``stream`` trains it in
    stream order at once, decided without influence (deterministic, so resume and exactly-once are
    unchanged; the schedule log row says ``first_chunk: stream_order``, not a fallback), and the
    influence actor scores chunk 1 while the trainers train chunk 0. The no-argument run uses
    ``stream`` (d3ray.config.FIRST_RUN_SCHEDULE). With ``in_trainer``, ``scored`` has the trainers score
    chunk 0 themselves before their first step, and ``stream`` skips that (they score chunk 1 first)."""
    snapshot_dtype: Literal["bfloat16", "float32"] = "bfloat16"
    """The dtype of the weights snapshot (and AdamW m, v) the trainers publish every chunk for the
    influence actors. ``bfloat16`` halves the bytes each chunk moves through the object store; the
    actors compute in ``influence.dtype`` either way, so only the snapshot is rounded (to 8 significant
    bits): ``d3ray bench influence --snapshot-dtype`` measures what that does to S and the order
    (d3ray/influence/README.md, "Snapshot dtype"). ``float32`` ships exact copies."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.snapshot_dtype not in SNAPSHOT_DTYPES:
            raise ValueError(
                f"schedule.snapshot_dtype={self.snapshot_dtype!r} must be one of {', '.join(SNAPSHOT_DTYPES)}"
            )
        if not 0 <= self.influence_nice <= 19:
            raise ValueError(f"schedule.influence_nice={self.influence_nice} must be in 0..19")
        if self.influence_actors < 1:
            raise ValueError(f"schedule.influence_actors={self.influence_actors} must be >= 1")
        if self.first_chunk not in ("scored", "stream"):
            raise ValueError(f"schedule.first_chunk={self.first_chunk!r} must be scored or stream")
        if self.influence_placement not in ("auto", "actors", "in_trainer"):
            raise ValueError(f"schedule.influence_placement={self.influence_placement!r} must be auto, actors or "
                             f"in_trainer")
        if self.in_trainer:
            self.influence.check_shardable()

    @property
    def placement(self) -> str:
        """``actors`` or ``in_trainer``: ``influence_placement`` with ``auto`` resolved (see the field)."""
        if self.influence_placement != "auto":
            return self.influence_placement
        own_resources = bool(self.influence_num_gpus or self.influence_resources)
        return "in_trainer" if self.influence.potential_alone and not own_resources else "actors"

    @property
    def in_trainer(self) -> bool:
        """The trainers score each chunk themselves (:attr:`placement` ``in_trainer``)."""
        return self.placement == "in_trainer"

    def trainer_requests(self) -> TrainerRequests:
        """``in_trainer``: the trainers sketch each chunk (no weights move); ``actors``: a weights snapshot
        per chunk for the influence actors, with the AdamW state for ``preconditioner: adam``."""
        if self.in_trainer:
            return TrainerRequests(sketch=SketchRequest(influence=self.influence, staleness=self.staleness, L=self.L,
                                                        first_chunk_scored=self.first_chunk == "scored"))
        return TrainerRequests(snapshot=SnapshotRequest(dtype=self.snapshot_dtype,
                                                        optimizer_state=self.influence.needs_optimizer_state))

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

    @property
    def sorts_in_influence_actor(self) -> bool:
        """One influence actor and :attr:`sorts_potential`: that actor sorts its f itself, and no solver
        actor (nor a merge task) is started: one hop per chunk instead of three."""
        return not self.in_trainer and self.influence_actors == 1 and self.sorts_potential

    @property
    def sorts_in_coordinator(self) -> bool:
        """``in_trainer`` and :attr:`sorts_potential`: the trainers send the chunk's f (L numbers) and the
        coordinator sorts them in place (microseconds); no solver actor is started."""
        return self.in_trainer and self.sorts_potential

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
        solver = ActorRequest("solver", self.solver_pool.num_actors,
                              {"CPU": self.solver_pool.num_cpus, **self.solver_pool.resources})
        if self.in_trainer:
            return [] if self.sorts_potential else [solver]
        influence = {"CPU": self.influence_num_cpus, "GPU": self.influence_num_gpus, **self.influence_resources}
        return [ActorRequest("influence", self.influence_actors, influence),
                *([] if self.sorts_potential else [solver])]

    def build(self, ctx: BuildContext):
        from d3ray.schedule.order.d3 import D3Scheduler

        return D3Scheduler(self, ctx)


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
    "schedule.influence_placement": (lambda c: c.placement, "actors"),
    "schedule.staleness": (lambda c: c.staleness, 1),
}


@ScheduleConfig.register("d3_paper")
@dataclass(frozen=True, kw_only=True)
class D3PaperScheduleConfig(D3ScheduleConfig):
    """D3 as the paper runs it: second-order influence with the Hutchinson diagonal Hessian and the plain
    step −γ·∇ℓ, sketched (JL, k = 3500), L = 60, ordered by Random-Swap Refinement (RSR), influence and
    solver actors one chunk ahead.

    Every other key is d3's. A key given on top overrides the preset, and the run's log (and every schedule
    log row's ``preset_departures``) names the preset keys it no longer holds, e.g. ``--schedule.solver.type=ils``
    (iterated local search: a stronger solver than the paper's RSR, d3ray/solver/README.md). A key that
    contradicts the preset is refused: in-trainer influence (the paper's estimator needs a double backward
    on whole parameters, in actors), or an estimator whose S is a potential (its order is a sort: RSR
    would search nothing; use ``schedule.type=d3``).
    """

    paper = "Xu et al. 2026, Dynamic Directional Graph-Constrained Data Scheduling (arXiv 2605.31164), §3-4"

    L: int = 60
    influence: InfluenceConfig = field(default_factory=_paper_influence)
    solver: SolverConfig = field(default_factory=RsrConfig)
    influence_placement: Literal["auto", "actors", "in_trainer"] = "actors"

    def __post_init__(self) -> None:
        if self.influence_placement == "in_trainer":
            raise ValueError(f"schedule.type=d3_paper computes influence in actors one chunk ahead; "
                             f"schedule.influence_placement={self.influence_placement} contradicts it (the trainers "
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


@ScheduleConfig.register("curriculum")
@dataclass(frozen=True, kw_only=True)
class CurriculumScheduleConfig(ScheduleConfig):
    """Curriculum learning within each chunk (Bengio et al. 2009; the D3 paper's easy→hard and
    hard→easy baselines): the chunk's sequences sorted by difficulty, re-batched, and trained in
    that order. Difficulty is the loss under the trainers' current weights (``reference: current``,
    a self-paced curriculum) or under a fixed model directory (``reference: PATH``), scored one chunk
    ahead by a scoring actor."""

    kind = Kind.ORDER
    paper = "Bengio et al. 2009, Curriculum Learning (ICML); the D3 paper's curriculum baselines"

    direction: Literal["easy_to_hard", "hard_to_easy"] = "easy_to_hard"
    """Low difficulty (loss) first, or high first."""
    reference: str = "current"
    """``current`` (the trainers' weights of the chunk's version) or a local Hugging Face model
    directory (e.g. one written by ``d3ray export``) that scores difficulty."""
    scorer_num_cpus: float = 1.0
    """CPUs of the scoring actor."""
    scorer_num_gpus: float = 0.0
    """GPUs of the scoring actor (fractional allowed)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.direction not in ("easy_to_hard", "hard_to_easy"):
            raise ValueError(f"schedule.direction={self.direction!r} must be easy_to_hard or hard_to_easy")

    def trainer_requests(self) -> TrainerRequests:
        return TrainerRequests(snapshot=SnapshotRequest() if self.reference == "current" else None)

    def actor_requests(self) -> list[ActorRequest]:
        return [ActorRequest("scorer", 1, {"CPU": self.scorer_num_cpus, "GPU": self.scorer_num_gpus})]

    def build(self, ctx: BuildContext):
        from d3ray.schedule.order.curriculum import CurriculumScheduler

        return CurriculumScheduler(self, ctx)


@ScheduleConfig.register("mtl")
@dataclass(frozen=True, kw_only=True)
class MtlScheduleConfig(ScheduleConfig):
    """Multi-task learning baseline (the D3 paper's MTL; Caruana 1997): every batch mixes the
    chunk's domains (tasks) in equal turns. The chunk's sequences are dealt round-robin over the
    domains present, then cut into batches, so no domain ever trains in a block of its own."""

    kind = Kind.ORDER
    paper = "Caruana 1997, Multitask Learning (Machine Learning 28); the D3 paper's MTL baseline"

    def build(self, ctx: BuildContext):
        from d3ray.schedule.order.mtl import MtlScheduler

        return MtlScheduler(ctx.seed)
