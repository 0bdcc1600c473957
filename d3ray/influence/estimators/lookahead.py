"""``lookahead``: the exact influence I[i→j] = ℓ(B_j; θ + Δθ_i) − ℓ(B_j; θ) by real parameter steps.

The paper's definition with its step Δθ_i = −γ·g_i (preconditioner ``none``), or with the trainers'
AdamW step (``adam``; :mod:`d3ray.influence.optimizer`): the reference the Taylor estimators are
measured against. Cost: one backward per row plus (rows + 1)·L forwards. Use float64 when the step is
small: the entries are differences of losses.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from d3ray.influence.estimators.base import EstimatorConfig

if TYPE_CHECKING:
    import torch

    from d3ray.influence.statistics import CrossEntropyObjective, Params

__all__ = ["LookaheadConfig", "lookahead_influence"]

#: g → Δθ for one batch (the step the batch would cause).
StepFn = Callable[["Params"], "Params"]


def _losses(objectives: Sequence[CrossEntropyObjective], params: Params) -> torch.Tensor:
    import torch

    with torch.no_grad():
        return torch.stack([obj.loss(params) for obj in objectives])


def lookahead_influence(
    objectives: Sequence[CrossEntropyObjective],
    params: Params,
    step: StepFn,
    rows: Sequence[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Exact look-ahead influence I[i→j] = ℓ(B_j; θ + Δθ_i) − ℓ(B_j; θ), Δθ_i = step(g_i).

    Only the parameters in ``params`` take the step (the same ones the Taylor path differentiates).

    Args:
        objectives: the L batches (probe sub-batches) B_1..B_L.
        params: name → leaf tensor with requires_grad.
        step: g_i → Δθ_i, e.g. ``lambda g: {n: -γ·t for n, t in g.items()}``.
        rows: which i to compute (default all L), to split the L rows across workers.

    Returns:
        (A_rows, losses, row_finite): A_rows (R, L) with A_rows[r, j] = I[rows[r] → j] (NaN where a
        loss is not finite); losses (L,) ℓ(B_j; θ); row_finite (R,) whether g_i was finite.
    """
    import torch

    from d3ray.influence.statistics import all_finite, batch_gradient

    rows = list(range(len(objectives))) if rows is None else list(rows)
    base = _losses(objectives, params)  # (L,)
    out = torch.full((len(rows), len(objectives)), float("nan"), dtype=base.dtype, device=base.device)
    row_finite = torch.zeros(len(rows), dtype=torch.bool)
    for r, i in enumerate(rows):
        _, g = batch_gradient(objectives[i], params)
        row_finite[r] = all_finite(g)
        if not row_finite[r]:
            continue
        delta = step(g)
        stepped = {n: p.detach() + delta[n] for n, p in params.items()}
        out[r] = _losses(objectives, stepped) - base
    return out, base, row_finite


@EstimatorConfig.register("lookahead")
@dataclass(frozen=True, kw_only=True)
class LookaheadConfig(EstimatorConfig):
    """Exact look-ahead (L backwards + L² forwards per chunk); the fidelity reference."""

    is_exact_lookahead: ClassVar[bool] = True

    def merge(self, parts: Sequence[Any], order: Sequence[int]) -> tuple[np.ndarray, np.ndarray, list[int]]:
        from d3ray.influence.influence import influence_from_lookahead

        return influence_from_lookahead(parts, order)
