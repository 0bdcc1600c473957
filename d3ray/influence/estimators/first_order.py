"""``first_order``: the gradient only, no second-order term.

Under the plain step (preconditioner ``none``) A = −γ·G Gᵀ is symmetric and S ≡ 0, so the order
falls back to the solver's initial order. Under the AdamW step the first-order term
−η·⟨u_i, g_j⟩ is not symmetric (momentum and weight decay move every step the same way; README.md),
so first_order gives a non-zero S there at the cost of one backward per batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from d3ray.influence.estimators.base import EstimatorConfig

if TYPE_CHECKING:
    import torch

    from d3ray.influence.statistics import BatchStatistics, CrossEntropyObjective, Params

__all__ = ["FirstOrderConfig"]


@EstimatorConfig.register("first_order")
@dataclass(frozen=True, kw_only=True)
class FirstOrderConfig(EstimatorConfig):
    """Gradient only (1 backward per batch)."""

    has_curvature: ClassVar[bool] = False
    runs_on_shards: ClassVar[bool] = True

    def statistics(
        self, objective: CrossEntropyObjective, params: Params, generator: torch.Generator
    ) -> BatchStatistics:
        from d3ray.influence.statistics import gradient_statistics

        return gradient_statistics(objective, params)
