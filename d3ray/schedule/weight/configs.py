"""Configs of the weight schedulers (registered on import)."""

from __future__ import annotations

from dataclasses import dataclass

from d3ray.schedule.config import ScheduleConfig, StagedScheduleConfig
from d3ray.schedule.scheduler import BuildContext, Kind
from d3ray.schedule.weight.loss_reweight import STRATEGIES, LossReweightHead


@ScheduleConfig.register("loss_reweight")
@dataclass(frozen=True, kw_only=True)
class LossReweightScheduleConfig(StagedScheduleConfig):
    """Dynamic loss-based sample reweighting: each sample's loss weight from its current loss
    within its micro-batch (strategies linupper, uniform, quadratic, extremes)."""

    kind = Kind.WEIGHT
    paper = "Sow et al. 2025, Dynamic Loss-Based Sample Reweighting for Improved LLM Pretraining (ICLR)"

    strategy: str = "linupper"
    """linupper (the paper's default), uniform, quadratic or extremes."""
    delta: float = 1.0
    """Half-width δ of the normalised loss range."""
    temperature: float = 1.0
    """Softmax temperature r of the weights."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.strategy not in STRATEGIES:
            raise ValueError(f"schedule.strategy={self.strategy!r} is not one of {', '.join(STRATEGIES)}")
        if not self.delta > 0:
            raise ValueError(f"schedule.delta={self.delta} must be > 0")
        if not self.temperature > 0:
            raise ValueError(f"schedule.temperature={self.temperature} must be > 0")

    def build_head(self, ctx: BuildContext) -> LossReweightHead:
        return LossReweightHead(self.strategy, self.delta, self.temperature)
