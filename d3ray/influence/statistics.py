"""The batch loss as a function of the parameters, and per-batch statistics (loss, g, h).

These are the inputs of the second-order influence of docs/design/method.md §2 (README.md for the
preconditioned form), with the step Δθ_i = −η·u_i of batch i,

    I[i→j] ≈ ⟨g_j, Δθ_i⟩ + ½·Δθ_iᵀ H_j Δθ_i ≈ −η·⟨u_i, g_j⟩ + (η²/2)·⟨u_i ⊙ u_i, h_j⟩,

computed in full dimension (the sketch comes after). Everything is a pure function of a parameter
dict ``name → tensor`` and a :class:`CrossEntropyObjective`, so the same code serves a transformers
causal LM (the worker), a softmax regression or a quadratic (the tests). The estimators of h live in
:mod:`d3ray.influence.estimators`, one module each:

- ``hutchinson``: h = (1/n) Σ_z z ⊙ (H z), z Rademacher (Hutchinson 1990; Sophia-H, Liu et al. 2023,
  "Sophia: a scalable stochastic second-order optimizer", Alg. 1): one Hessian-vector product each.
- ``gnb``: Gauss-Newton-Bartlett (Sophia-G, Liu et al. 2023, Alg. 2): labels ŷ sampled from the model's
  own softmax, h = N · ∇L̂(θ) ⊙ ∇L̂(θ) with N the number of scored tokens; unbiased for the diagonal of
  the Gauss-Newton matrix of the mean loss (Bartlett's identity).
- ``fisher``: empirical Fisher from per-example gradients, h = (1/b) Σ_n T_n · ∇ℓ_n ⊙ ∇ℓ_n with ℓ_n the
  mean loss of sequence n over its T_n tokens (the T_n factor puts it on the scale of the token-level
  Fisher, as Sophia's N does). It must be per example: with the batch gradient squared, ⟨g_i², h_j⟩
  would be symmetric in (i, j) and S would vanish.
- ``first_order``: no h (the second-order term is zero, S ≡ 0).

:func:`taylor_influence` is the second-order expansion with the exact Hessian (L² Hessian-vector
products), which separates the Taylor truncation from the diagonal approximation of the estimators;
the exact look-ahead is :func:`d3ray.influence.estimators.lookahead.lookahead_influence`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)

__all__ = [
    "IGNORE_INDEX",
    "BatchStatistics",
    "CrossEntropyObjective",
    "Params",
    "all_finite",
    "batch_gradient",
    "taylor_influence",
]

Params = dict[str, torch.Tensor]
IGNORE_INDEX = -100


@dataclass(frozen=True)
class CrossEntropyObjective:
    """ℓ(B; θ): mean token cross-entropy of one batch as a function of the parameters.

    Attributes:
        logits_fn: (params, inputs (b, ...)) → logits (b, ..., C) aligned with ``labels`` (for a causal
            LM: the logits of positions 0..T−2, the labels being tokens 1..T−1).
        inputs: (b, ...) model inputs, b examples (sequences).
        labels: (b, ...) int64 targets; IGNORE_INDEX (−100) positions are not scored.
    """

    logits_fn: Callable[[Params, torch.Tensor], torch.Tensor]
    inputs: torch.Tensor
    labels: torch.Tensor

    def loss_from_logits(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy over the scored positions; logits (..., C), labels (...)."""
        return F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE_INDEX
        )

    def loss(self, params: Params) -> torch.Tensor:
        """Scalar mean loss of the batch at ``params``."""
        return self.loss_from_logits(self.logits_fn(params, self.inputs), self.labels)

    def example_loss(self, params: Params, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Loss of one example (inputs and labels without the batch dim); vmap-able; 0 if nothing is scored."""
        logits = self.logits_fn(params, inputs.unsqueeze(0))
        flat_labels = labels.reshape(-1)
        losses = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), flat_labels, ignore_index=IGNORE_INDEX, reduction="none"
        )
        count = (flat_labels != IGNORE_INDEX).sum()
        return losses.sum() / count.clamp(min=1)

    def scored_tokens(self) -> torch.Tensor:
        """(b,) number of scored positions per example."""
        return (self.labels != IGNORE_INDEX).reshape(self.labels.shape[0], -1).sum(dim=1)


@dataclass
class BatchStatistics:
    """Full-dimension statistics of one batch.

    Attributes:
        loss: ℓ(B; θ) as a float (NaN/inf when the batch is bad).
        grad: name → g, shaped like the parameter.
        hdiag: name → h (Hessian-diagonal estimate), or None for ``first_order``.
        finite: loss, g and h are all finite.
    """

    loss: float
    grad: Params
    hdiag: Params | None
    finite: bool


def all_finite(tensors: Sequence[torch.Tensor] | Params | None) -> bool:
    """True when every element of every tensor is finite (None counts as finite)."""
    if tensors is None:
        return True
    values = list(tensors.values() if isinstance(tensors, Mapping) else tensors)
    if not values:
        return True
    # One read per tensor and one sync: a NaN or ±inf anywhere makes the sum NaN or ±inf. A finite sum
    # proves every element finite; a non-finite one may be an overflow of finite values: then look.
    if bool(torch.isfinite(torch.stack([t.sum(dtype=torch.float32) for t in values]).sum())):
        return True
    return all(bool(torch.isfinite(t).all()) for t in values)


def batch_gradient(objective: CrossEntropyObjective, params: Params) -> tuple[float, Params]:
    """(loss, g) of one batch: one forward and one backward."""
    loss = objective.loss(params)
    grads = torch.autograd.grad(loss, list(params.values()))
    return float(loss.detach()), {n: t.detach() for n, t in zip(params, grads, strict=True)}


def gradient_statistics(objective: CrossEntropyObjective, params: Params) -> BatchStatistics:
    """A batch's loss and gradient, no curvature (``first_order``, ``drift``): one forward and one backward."""
    loss, g = batch_gradient(objective, params)
    finite = bool(torch.isfinite(torch.tensor(loss))) and all_finite(g)
    return BatchStatistics(loss=loss, grad=g, hdiag=None, finite=finite)


def taylor_influence(
    objectives: Sequence[CrossEntropyObjective], params: Params, steps: Sequence[Params]
) -> torch.Tensor:
    """Second-order Taylor influence with the exact Hessian: A[i, j] = ⟨g_j, Δθ_i⟩ + ½·Δθ_iᵀ H_j Δθ_i.

    For the plain step Δθ_i = −γ·g_i this is −γ⟨g_i, g_j⟩ + (γ²/2)·g_iᵀ H_j g_i (docs/design/method.md §2).
    L gradients plus L² Hessian-vector products; a diagnostic that separates the Taylor truncation
    from the diagonal approximation of the estimators.

    Args:
        objectives: the L batches.
        params: name → leaf tensor with requires_grad.
        steps: per batch i the step Δθ_i, name → tensor (the same names as ``params``).

    Returns:
        A (L, L).
    """
    leaves = list(params.values())
    grads = [batch_gradient(obj, params)[1] for obj in objectives]
    flat_g = torch.stack([torch.cat([g[n].reshape(-1) for n in params]) for g in grads])  # (L, d)
    flat_s = torch.stack([torch.cat([s[n].reshape(-1) for n in params]) for s in steps])  # (L, d)
    A = flat_s @ flat_g.T  # A[i, j] = ⟨Δθ_i, g_j⟩
    for j, obj in enumerate(objectives):
        g_j = torch.autograd.grad(obj.loss(params), leaves, create_graph=True)
        for i, step in enumerate(steps):
            direction = [step[n] for n in params]
            hv = torch.autograd.grad(g_j, leaves, grad_outputs=direction, retain_graph=True)
            A[i, j] += 0.5 * sum((a * b).sum() for a, b in zip(direction, hv, strict=True))
    return A
