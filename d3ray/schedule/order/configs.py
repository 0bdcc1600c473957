"""Configs of the order schedulers (registered on import; the schedulers are imported by ``build``).

D3's configs, presets and placements are the package :mod:`d3ray.schedule.order.d3`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from d3ray.schedule.config import ScheduleConfig
from d3ray.schedule.scheduler import ActorRequest, BuildContext, Kind, SnapshotRequest, TrainerRequests


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
