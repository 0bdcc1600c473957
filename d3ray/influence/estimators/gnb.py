"""``gnb``: the Gauss-Newton-Bartlett diagonal (Sophia-G; Liu et al. 2023, "Sophia: a scalable
stochastic second-order optimizer for language model pre-training", Alg. 2).

Labels ŷ are sampled from the model's own softmax at the N scored positions and h = N · ĝ ⊙ ĝ with ĝ
the gradient of the mean loss on ŷ: unbiased for the diagonal of the Gauss-Newton matrix of the mean
loss (Bartlett's identity). One forward and 1 + samples backwards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from d3ray.influence.estimators.base import EstimatorConfig

if TYPE_CHECKING:
    import torch

    from d3ray.influence.statistics import BatchStatistics, CrossEntropyObjective, Params

__all__ = ["GnbConfig", "gnb_samples"]


def gnb_samples(
    objective: CrossEntropyObjective, params: Params, samples: int, generator: torch.Generator
) -> tuple[torch.Tensor, Params, list[Params]]:
    """Loss, gradient and ``samples`` draws of N · ĝ ⊙ ĝ (their mean is the GNB diagonal).

    The draws come from ``generator`` in order, so the first n draws of a call with more samples are
    the draws of a call with n samples (the benchmark uses this to cost 1..n samples at once).
    """
    import torch

    from d3ray.influence.statistics import IGNORE_INDEX

    names, leaves = list(params), list(params.values())
    logits = objective.logits_fn(params, objective.inputs)  # (b, ..., C)
    loss = objective.loss_from_logits(logits, objective.labels)
    grads = torch.autograd.grad(loss, leaves, retain_graph=True)
    scored = objective.labels != IGNORE_INDEX  # (b, ...)
    count = int(scored.sum())
    flat = logits.detach().reshape(-1, logits.shape[-1])
    probs = torch.softmax(flat if flat.dtype == torch.float64 else flat.float(), dim=-1)  # (N, C)
    draws = []
    for sample in range(samples):
        drawn = torch.multinomial(probs, 1, generator=generator).reshape(scored.shape)
        sampled = torch.where(scored, drawn, torch.full_like(drawn, IGNORE_INDEX))
        sampled_loss = objective.loss_from_logits(logits, sampled)
        ghat = torch.autograd.grad(sampled_loss, leaves, retain_graph=sample < samples - 1)
        # addcmul into zeros: the same arithmetic as the accumulation this replaced (regression test).
        draws.append(
            {n: torch.zeros_like(gi).addcmul_(gi, gi, value=float(count)) for n, gi in zip(names, ghat, strict=True)}
        )
    g = {n: t.detach() for n, t in zip(names, grads, strict=True)}
    return loss.detach(), g, draws


def mean_of(draws: list[Params]) -> Params:
    """The average of per-draw diagonals, summed in draw order."""
    out = {n: t.clone() for n, t in draws[0].items()}
    for d in draws[1:]:
        for n, t in d.items():
            out[n].add_(t)
    return {n: t / len(draws) for n, t in out.items()}


@EstimatorConfig.register("gnb")
@dataclass(frozen=True, kw_only=True)
class GnbConfig(EstimatorConfig):
    """Gauss-Newton-Bartlett diagonal (1 + samples backwards)."""

    samples: int = 1
    """Label samples per batch (one backward each)."""

    def __post_init__(self) -> None:
        if self.samples < 1:
            raise ValueError(f"estimator.samples must be >= 1, got {self.samples}")

    def statistics(
        self, objective: CrossEntropyObjective, params: Params, generator: torch.Generator
    ) -> BatchStatistics:
        import torch

        from d3ray.influence.statistics import BatchStatistics, all_finite

        loss, g, draws = gnb_samples(objective, params, self.samples, generator)
        h = mean_of(draws)
        finite = bool(torch.isfinite(loss)) and all_finite(g) and all_finite(h)
        return BatchStatistics(loss=float(loss), grad=g, hdiag=h, finite=finite)
