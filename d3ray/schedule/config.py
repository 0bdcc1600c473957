"""Schedule configs: the registry of schedulers, their common fields and what each declares.

Selected in YAML by ``schedule: {type: d3 | random | less | ..., L: 8, ...}``. A config is the
registry entry and declares, before anything starts, what its scheduler asks of the trainers and
starts (``kind``, ``trainer_requests()``, ``draws_mixture``, ``actor_requests()``, ``window_batches()``),
and the work it needs done before the run (``before_run(ctx)``, a no-op but for the mixers that train a
reference or proxies first); ``build(ctx)`` makes the scheduler. Built-ins register when ``d3ray.schedule`` is imported (``d3ray schedulers`` lists them).

A select or weight scheduler hands the batches it keeps to an order scheduler, its ``order`` field
(default ``random``): ``{type: loss, fraction: 0.5, order: {type: d3}}``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from d3ray.registry import ChoiceConfig
from d3ray.schedule.scheduler import ActorRequest, BuildContext, Kind, TrainerRequests

if TYPE_CHECKING:
    from d3ray.schedule.mix.prerun import PreRunContext
    from d3ray.schedule.scheduler import Scheduler


@dataclass(frozen=True, kw_only=True)
class ScheduleConfig(ChoiceConfig):
    """Common fields of every scheduler, and what each one declares."""

    kind: ClassVar[Kind] = Kind.ORDER
    paper: ClassVar[str] = ""
    """The paper the scheduler implements (``d3ray schedulers`` prints it)."""

    L: int = 8
    """Chunk length: consecutive global batches scheduled together (the paper: 60)."""
    prefetch_chunks: int = 2
    """Decided chunks prepared ahead of the trainers (bounded queue)."""
    shuffle_buffer: int = 0
    """Seeded streaming shuffle of packed sequences before batching (0 = stream order)."""
    staleness: int = 1
    """Schedulers that need weights or feedback decide chunk c with the weights after chunk
    c − 1 − staleness and the feedback of chunks < c − staleness. 1: one chunk ahead, overlapped with
    training; 0: at the weights after chunk c − 1 (the trainers wait for the decision)."""
    deadline_s: float = 120.0
    """How long the trainers wait for a decision past the moment they need it; then the fallback."""
    order_transform: str = "none"
    """Applied to every decided order (fallbacks included) before it trains: ``none``, ``reverse``
    (the order backwards) or ``alternate`` (its two ends interleaved: o0, o_{L-1}, o1, ...), the
    direction and anti-sortedness controls of D3 (``d3ray/schedule/order/transform.py``); the schedule
    log's ``order_transform`` records it."""

    def __post_init__(self) -> None:
        from d3ray.schedule.order.transform import ORDER_TRANSFORMS

        if self.order_transform not in ORDER_TRANSFORMS:
            raise ValueError(f"schedule.order_transform={self.order_transform!r} must be one of "
                             f"{', '.join(ORDER_TRANSFORMS)}")
        if self.L < 1:
            raise ValueError(f"schedule.L={self.L} must be >= 1")
        if self.prefetch_chunks < 1:
            raise ValueError(f"schedule.prefetch_chunks={self.prefetch_chunks} must be >= 1")
        if self.shuffle_buffer < 0:
            raise ValueError(f"schedule.shuffle_buffer={self.shuffle_buffer} must be >= 0")
        if self.staleness not in (0, 1):
            raise ValueError(f"schedule.staleness={self.staleness} must be 0 or 1")
        if not self.deadline_s > 0:
            raise ValueError(f"schedule.deadline_s={self.deadline_s} must be > 0")

    def trainer_requests(self) -> TrainerRequests:
        """What the scheduler asks of the trainers (d3ray/train/scheduling/trainer_side.py carries it out)."""
        return TrainerRequests()

    def check_train(self, train: Any) -> None:
        """Raise ValueError (naming the keys) for a train config (``TrainConfig``) this scheduler cannot run
        beside; ``RunConfig`` asks when it is built. None here (D3's placement has its rules)."""
        return None

    @property
    def draws_mixture(self) -> bool:
        """The scheduler decides each chunk's domain mixture (``mixture(chunk_id)``): the stream draws every
        chunk by domain (d3ray/data/README.md, "mixed"). The mixers (``Kind.MIX``)."""
        return self.kind is Kind.MIX

    def before_run(self, ctx: PreRunContext) -> None:
        """Work before the main run, called by the driver once Ray is up, for every scheduler (a no-op here;
        DoReMi trains or exports its reference model, RegMix runs its proxies)."""
        return None

    def actor_requests(self) -> list[ActorRequest]:
        """The Ray actors the scheduler starts (sweep resource accounting, ``placement.json``)."""
        return []

    def window_batches(self) -> int:
        """Candidate batches per chunk: L, or more for a selector that keeps L of them."""
        return self.L

    def build(self, ctx: BuildContext) -> Scheduler:
        raise NotImplementedError(f"schedule.type={self.type_name!r} has no build()")

    def build_transformed(self, ctx: BuildContext) -> Scheduler:
        """``build(ctx)`` with ``order_transform`` applied to its decided orders."""
        from d3ray.schedule.order.transform import with_order_transform

        return with_order_transform(self.build(ctx), self.order_transform)


def resources_total(requests: list[ActorRequest]) -> dict[str, float]:
    """Sum of the resources of ``requests`` by resource name."""
    out: dict[str, float] = {}
    for request in requests:
        for name, amount in request.total().items():
            out[name] = out.get(name, 0.0) + amount
    return out


@dataclass(frozen=True, kw_only=True)
class StagedScheduleConfig(ScheduleConfig):
    """A select, weight or mix scheduler: it decides what trains (which samples, how much, from which
    domains), then ``order`` orders it."""

    order: ScheduleConfig = field(default_factory=lambda: ScheduleConfig.lookup("random")())
    """The order scheduler of the batches this one keeps (its L and window are this config's)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.order.kind is not Kind.ORDER:
            raise ValueError(
                f"schedule.order.type={self.order.type_name!r} is a {self.order.kind} scheduler; "
                f"it must be an order scheduler ({', '.join(known_of_kind(Kind.ORDER))})"
            )
        if self.order.trainer_requests().sketch is not None:  # they would sketch the window, not what is kept
            raise ValueError(
                f"schedule.order.placement.type=in_trainer under a {self.kind} scheduler: the trainers sketch "
                f"a chunk's whole candidate window, not the batches {self.type_name!r} keeps; use "
                f"schedule.order.placement.type=actors (or a d3 schedule of its own)"
            )

    def trainer_requests(self) -> TrainerRequests:
        """This stage's requests and the order stage's, merged; the run's decisions follow this config's
        ``staleness`` (the coordinator's), so a snapshot the order declares read later is capped to it."""
        import dataclasses

        requests = self.own_trainer_requests() | self.order.trainer_requests()
        snapshot = requests.snapshot
        if snapshot is not None and snapshot.staleness > self.staleness:
            requests = dataclasses.replace(requests, snapshot=dataclasses.replace(snapshot, staleness=self.staleness))
        return requests

    def check_train(self, train: Any) -> None:
        self.order.check_train(train)

    def own_trainer_requests(self) -> TrainerRequests:
        """What this stage itself asks of the trainers (the order stage's requests are merged in)."""
        return TrainerRequests()

    def actor_requests(self) -> list[ActorRequest]:
        return self.own_actor_requests() + self.order.actor_requests()

    def own_actor_requests(self) -> list[ActorRequest]:
        return []

    def build(self, ctx: BuildContext) -> Scheduler:
        from d3ray.schedule.staged import StagedScheduler

        return StagedScheduler(self.build_head(ctx), self.order.build_transformed(ctx), ctx.batch_size)

    def build_head(self, ctx: BuildContext) -> Any:
        raise NotImplementedError


def known_of_kind(kind: Kind) -> list[str]:
    """Registered scheduler names of one kind."""
    return [name for name in ScheduleConfig.known() if ScheduleConfig.lookup(name).kind is kind]


@ScheduleConfig.register("sequential")
@dataclass(frozen=True, kw_only=True)
class SequentialScheduleConfig(ScheduleConfig):
    """Batches in stream order (no reordering)."""

    def build(self, ctx: BuildContext) -> Scheduler:
        from d3ray.schedule.order.basic import SequentialScheduler

        return SequentialScheduler()


@ScheduleConfig.register("random")
@dataclass(frozen=True, kw_only=True)
class RandomScheduleConfig(ScheduleConfig):
    """A seeded uniform random permutation of each chunk: the baseline."""

    order_seed: int = 0
    """Another random order for the same run seed (model init and data unchanged): 0 is the baseline's
    order; any other value an independent one, e.g. the A/A arm of ``d3ray compare`` that measures
    order noise."""

    def build(self, ctx: BuildContext) -> Scheduler:
        from d3ray.schedule.order.basic import RandomScheduler

        return RandomScheduler(ctx.seed, self.order_seed)
