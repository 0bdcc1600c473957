"""``hutchinson``: the Hutchinson diagonal h = (1/n) Σ_z z ⊙ (H z), z Rademacher (Hutchinson 1990;
Sophia-H, Liu et al. 2023, "Sophia: a scalable stochastic second-order optimizer", Alg. 1), the paper's
estimator: one Hessian-vector product per probe, sharing one gradient graph.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from d3ray.influence.estimators.base import EstimatorConfig
from d3ray.influence.estimators.gnb import mean_of

if TYPE_CHECKING:
    import torch

    from d3ray.influence.statistics import BatchStatistics, CrossEntropyObjective, Params

__all__ = ["HutchinsonConfig", "hutchinson_samples"]


def _rademacher_like(t: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    import torch

    return torch.randint(0, 2, t.shape, generator=generator, device=t.device).to(t.dtype) * 2 - 1


def hutchinson_samples(
    loss_fn: Callable[[Params], torch.Tensor], params: Params, probes: int, generator: torch.Generator
) -> tuple[torch.Tensor, Params, list[Params]]:
    """Loss, gradient and the ``probes`` draws z ⊙ (H z) of a scalar loss (their mean is h).

    Probes come from ``generator`` in order, so the first n draws of a call with more probes are the
    draws of a call with n probes (the benchmark costs 1..n probes from one call).

    Args:
        loss_fn: params → scalar loss (twice differentiable).
        params: name → leaf tensor with requires_grad.
        probes: n Rademacher probes, one Hessian-vector product each.
        generator: source of the probes (on the parameters' device).
    """
    import torch

    names, leaves = list(params), list(params.values())
    loss = loss_fn(params)
    grads = torch.autograd.grad(loss, leaves, create_graph=True)
    draws = []
    for probe in range(probes):
        z = [_rademacher_like(p, generator) for p in leaves]
        hz = torch.autograd.grad(grads, leaves, grad_outputs=z, retain_graph=probe < probes - 1)
        draws.append({n: zi * hzi for n, zi, hzi in zip(names, z, hz, strict=True)})
    g = {n: t.detach() for n, t in zip(names, grads, strict=True)}
    return loss.detach(), g, draws


@EstimatorConfig.register("hutchinson")
@dataclass(frozen=True, kw_only=True)
class HutchinsonConfig(EstimatorConfig):
    """Hutchinson diagonal (1 backward with graph + probes Hessian-vector products)."""

    needs_double_backward: ClassVar[bool] = True
    probes: int = 1
    """Rademacher probes z per batch (one Hessian-vector product each)."""

    def __post_init__(self) -> None:
        if self.probes < 1:
            raise ValueError(f"estimator.probes must be >= 1, got {self.probes}")

    def statistics(
        self, objective: CrossEntropyObjective, params: Params, generator: torch.Generator
    ) -> BatchStatistics:
        import torch

        from d3ray.influence.statistics import BatchStatistics, all_finite

        loss, g, draws = hutchinson_samples(objective.loss, params, self.probes, generator)
        h = mean_of(draws)
        finite = bool(torch.isfinite(loss)) and all_finite(g) and all_finite(h)
        return BatchStatistics(loss=float(loss), grad=g, hdiag=h, finite=finite)
