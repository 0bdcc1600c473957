"""``fisher``: the per-example empirical Fisher diagonal as the Hessian diagonal.

h = (1/b') Σ_n T_n · ∇ℓ_n ⊙ ∇ℓ_n, with ℓ_n the mean loss of sequence n over its T_n scored tokens
(the T_n factor puts it on the scale of the token-level Fisher, as Sophia's N does; Kunstner et al.
2019, "Limitations of the empirical Fisher approximation", for what it does and does not estimate).
It must be per example: with the batch gradient squared, ⟨q_i, h_j⟩ would be symmetric in (i, j) and
S would vanish. Per-example gradients come from ``torch.func.vmap(grad(...))``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from d3ray.influence.estimators.base import EstimatorConfig

if TYPE_CHECKING:
    import torch

    from d3ray.influence.statistics import BatchStatistics, CrossEntropyObjective, Params

__all__ = ["FisherConfig", "fisher_diagonal"]


def fisher_diagonal(objective: CrossEntropyObjective, params: Params, chunk: int) -> Params:
    """Empirical Fisher diagonal from per-example gradients: h = (1/b') Σ_n T_n ∇ℓ_n ⊙ ∇ℓ_n.

    Per-example gradients come from ``vmap(grad(example_loss))`` over ``chunk`` examples at a time
    (memory chunk · d). Examples with no scored token are skipped (b' counts the others).
    """
    import torch
    from torch.func import grad, vmap

    detached = {n: p.detach() for n, p in params.items()}
    per_example = vmap(grad(objective.example_loss), in_dims=(None, 0, 0))
    tokens = objective.scored_tokens()  # (b,)
    h = {n: torch.zeros_like(p) for n, p in detached.items()}
    for lo in range(0, objective.inputs.shape[0], chunk):
        part = per_example(detached, objective.inputs[lo : lo + chunk], objective.labels[lo : lo + chunk])
        weight = tokens[lo : lo + chunk].to(next(iter(h.values())).dtype)  # (c,)
        for name, g_n in part.items():  # g_n: (c, *shape)
            h[name] += torch.einsum("c,c...->...", weight, g_n * g_n)
    used = max(int((tokens > 0).sum()), 1)
    return {n: t / used for n, t in h.items()}


@EstimatorConfig.register("fisher")
@dataclass(frozen=True, kw_only=True)
class FisherConfig(EstimatorConfig):
    """Per-example empirical Fisher (1 backward + b per-example backwards, vmapped)."""

    chunk: int = 8
    """Sequences per vmapped per-example-gradient call (memory: chunk · d)."""

    def __post_init__(self) -> None:
        if self.chunk < 1:
            raise ValueError(f"estimator.chunk must be >= 1, got {self.chunk}")

    def statistics(
        self, objective: CrossEntropyObjective, params: Params, generator: torch.Generator
    ) -> BatchStatistics:
        import torch

        from d3ray.influence.statistics import BatchStatistics, all_finite, batch_gradient

        loss, g = batch_gradient(objective, params)
        h = fisher_diagonal(objective, params, self.chunk)
        finite = bool(torch.isfinite(torch.tensor(loss))) and all_finite(g) and all_finite(h)
        return BatchStatistics(loss=loss, grad=g, hdiag=h, finite=finite)
