"""Configs of the select schedulers (registered on import)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from d3ray.schedule.config import ScheduleConfig, StagedScheduleConfig
from d3ray.schedule.scheduler import ActorRequest, BuildContext, Kind, Needs


@dataclass(frozen=True, kw_only=True)
class SelectScheduleConfig(StagedScheduleConfig):
    """Common fields of the selectors: keep ``fraction`` of a window of ⌈L / fraction⌉ batches."""

    kind = Kind.SELECT

    fraction: float = 0.5
    """Fraction of the candidate window kept; the window is ⌈L / fraction⌉ batches, L of them train."""
    warmup_chunks: int = 0
    """Chunks before scoring starts; they keep a seeded random subset (DataFlex's warmup_step)."""
    update_every: int = 1
    """Score every this many chunks; the chunks between keep a seeded random subset (DataFlex's update_step)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 < self.fraction <= 1.0:
            raise ValueError(f"schedule.fraction={self.fraction} must be in (0, 1]")
        if self.warmup_chunks < 0:
            raise ValueError(f"schedule.warmup_chunks={self.warmup_chunks} must be >= 0")
        if self.update_every < 1:
            raise ValueError(f"schedule.update_every={self.update_every} must be >= 1")

    def window_batches(self) -> int:
        return math.ceil(self.L / self.fraction - 1e-9)


@ScheduleConfig.register("random_select")
@dataclass(frozen=True, kw_only=True)
class RandomSelectScheduleConfig(SelectScheduleConfig):
    """A seeded uniform random subset of each window (the selection baseline)."""

    paper = "the selection baseline of DataFlex (OpenDCAI/DataFlex) and LESS (Xia et al. 2024)"

    def build_head(self, ctx: BuildContext):
        from d3ray.schedule.select.base import RandomSelectHead

        return RandomSelectHead(self, ctx.seed, "random_select")


@dataclass(frozen=True, kw_only=True)
class ScorerSelectScheduleConfig(SelectScheduleConfig):
    """A selector that scores candidates with a model on a scoring actor."""

    scorer_num_cpus: float = 1.0
    """CPUs of the scoring actor."""
    scorer_num_gpus: float = 0.0
    """GPUs of the scoring actor (fractional allowed)."""

    def own_needs(self) -> Needs:
        return Needs(weights=True)

    def own_actor_requests(self) -> list[ActorRequest]:
        return [ActorRequest("scorer", 1, {"CPU": self.scorer_num_cpus, "GPU": self.scorer_num_gpus})]


@ScheduleConfig.register("loss")
@dataclass(frozen=True, kw_only=True)
class LossSelectScheduleConfig(ScorerSelectScheduleConfig):
    """Keep the candidates of highest current loss (DataFlex's Loss selector; online batch selection
    by loss, Loshchilov & Hutter 2015), scored one chunk ahead at the weights of version c − staleness."""

    paper = "Loshchilov & Hutter 2015, Online Batch Selection for Faster Training of Neural Networks; DataFlex Loss"

    def build_head(self, ctx: BuildContext):
        from d3ray.schedule.select.loss import LossSelectHead

        return LossSelectHead(self, ctx)
