"""Dynamic loss-based sample reweighting (Sow et al., ICLR 2025), the in-step rule and its scheduler.

Within a group of samples (here: one micro-batch, whose sequences do not depend on the number of
workers), per-sample losses ℓ are normalised to [−δ, δ] by the group's min and max,

    x_i = 2δ·ℓ_i / (ℓ_max − ℓ_min) − δ·(ℓ_max + ℓ_min) / (ℓ_max − ℓ_min),

mapped by a strategy g (the paper's Table 1; DataFlex's Loss weighter):

    linupper  g(x) = min(x + δ, δ)     (up-weights hard samples, caps the hardest: the paper's default)
    uniform   g(x) = x
    quadratic g(x) = 1 − x²/δ²        (down-weights both extremes)
    extremes  g(x) = |x|              (up-weights both extremes)

and turned into weights by a softmax with temperature r: w_i = exp(g(x_i)/r) / Σ_j exp(g(x_j)/r).
The group's loss is Σ_i w_i·ℓ_i; d3ray writes it as the mean of (n·w_i)·ℓ_i, i.e. weights with mean
1, so that a run without weighting is the special case w ≡ 1. The weights are computed from the
step's own losses, detached (no gradient flows through them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from d3ray.data.chunker import Chunk
from d3ray.schedule.scheduler import (
    ChunkDecision,
    Decided,
    LossWeighting,
    SchedulerBase,
    SubmitContext,
)

if TYPE_CHECKING:
    import torch

STRATEGIES = ("linupper", "uniform", "quadratic", "extremes")


def normalized_losses(losses: torch.Tensor, delta: float) -> torch.Tensor:
    """Losses mapped affinely onto [−δ, δ] by their min and max (all 0 when they are all equal)."""
    lo, hi = losses.min(), losses.max()
    span = (hi - lo).clamp(min=1e-6)
    return 2.0 * delta * losses / span - delta * (hi + lo) / span


def strategy_scores(x: torch.Tensor, strategy: str, delta: float) -> torch.Tensor:
    """g(x) of the strategy (see the module docstring)."""
    if strategy == "linupper":
        return (x + delta).clamp(max=delta)
    if strategy == "uniform":
        return x
    if strategy == "quadratic":
        return 1.0 - x**2 / delta**2
    if strategy == "extremes":
        return x.abs()
    raise ValueError(f"unknown loss-reweighting strategy {strategy!r}; known: {', '.join(STRATEGIES)}")


def loss_weights(losses: torch.Tensor | np.ndarray, strategy: str, delta: float = 1.0,
                 temperature: float = 1.0) -> torch.Tensor | np.ndarray:
    """Per-sample weights (mean 1) of one group's losses (n,) under ``strategy``, in float64.

    A tensor stays on its device (the trainers' step: no copy to the host, no synchronisation);
    a numpy array gives a numpy array.
    """
    import torch  # here: the config registry imports this module, and must not pull in torch

    if isinstance(losses, np.ndarray):
        return loss_weights(torch.from_numpy(losses.astype(np.float64)), strategy, delta, temperature).numpy()
    losses = losses.detach().double()
    scores = strategy_scores(normalized_losses(losses, delta), strategy, delta) / temperature
    return torch.softmax(scores, dim=0) * losses.numel()


class LossReweightHead(SchedulerBase):
    """Every chunk trains whole, under the in-step rule; the order stage orders it."""

    def __init__(self, strategy: str, delta: float, temperature: float) -> None:
        self.rule = LossWeighting(strategy, {"delta": delta, "temperature": temperature})

    def submit(self, chunk: Chunk, batch_refs: tuple, context: SubmitContext) -> Decided:
        return Decided(self.fallback(chunk, ""))

    def fallback(self, chunk: Chunk, reason: str) -> ChunkDecision:
        return ChunkDecision(order=tuple(range(chunk.size)), loss_weighting=self.rule,
                             record={"scheduler": "loss_reweight", "strategy": self.rule.strategy})
