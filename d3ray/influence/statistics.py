"""Per-batch statistics at parameters θ: loss, gradient g and a Hessian-diagonal estimate h.

These are the inputs of the second-order influence of ARCHITECTURE.md section 1,

    I[i→j] ≈ −γ·⟨g_i, g_j⟩ + (γ²/2)·g_iᵀ H_j g_i ≈ −γ·⟨g_i, g_j⟩ + (γ²/2)·⟨g_i ⊙ g_i, h_j⟩,

computed here in full dimension (the sketch comes after). Everything is a pure function of a
parameter dict ``name → tensor`` and a :class:`CrossEntropyObjective`, so the same code serves a
transformers causal LM (the worker), a softmax regression or a quadratic (the tests). Estimators of h:

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

:func:`lookahead_influence` computes the exact definition I[i→j] = ℓ(B_j; θ − γ g_i) − ℓ(B_j; θ) and
:func:`taylor_influence` its second-order expansion with the exact Hessian (L² Hessian-vector
products), the references against which the estimators are validated.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.func import grad, vmap

logger = logging.getLogger(__name__)

__all__ = [
    "BatchStatistics",
    "CrossEntropyObjective",
    "Params",
    "all_finite",
    "batch_statistics",
    "fisher_diagonal",
    "gnb_diagonal",
    "hutchinson_diagonal",
    "lookahead_influence",
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
    values = tensors.values() if isinstance(tensors, dict) else tensors
    return all(bool(torch.isfinite(t).all()) for t in values)


def _rademacher_like(t: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return torch.randint(0, 2, t.shape, generator=generator, device=t.device).to(t.dtype) * 2 - 1


def hutchinson_diagonal(
    loss_fn: Callable[[Params], torch.Tensor], params: Params, probes: int, generator: torch.Generator
) -> tuple[torch.Tensor, Params, Params]:
    """Loss, gradient and Hutchinson diagonal h = (1/n) Σ z ⊙ (H z) of a scalar loss.

    Args:
        loss_fn: params → scalar loss (twice differentiable).
        params: name → leaf tensor with requires_grad.
        probes: n Rademacher probes, one Hessian-vector product each (sharing one gradient graph).
        generator: source of the probes (on the parameters' device).

    Returns:
        (loss, g, h): loss detached; g and h name → tensor shaped like the parameter.
    """
    names, leaves = list(params), list(params.values())
    loss = loss_fn(params)
    grads = torch.autograd.grad(loss, leaves, create_graph=True)
    h = [torch.zeros_like(p) for p in leaves]
    for probe in range(probes):
        z = [_rademacher_like(p, generator) for p in leaves]
        hz = torch.autograd.grad(grads, leaves, grad_outputs=z, retain_graph=probe < probes - 1)
        for acc, zi, hzi in zip(h, z, hz, strict=True):
            acc.add_(zi * hzi)
    g = {n: t.detach() for n, t in zip(names, grads, strict=True)}
    return loss.detach(), g, {n: t / probes for n, t in zip(names, h, strict=True)}


def gnb_diagonal(
    objective: CrossEntropyObjective, params: Params, samples: int, generator: torch.Generator
) -> tuple[torch.Tensor, Params, Params]:
    """Loss, gradient and the Gauss-Newton-Bartlett diagonal h = N · ĝ ⊙ ĝ (Sophia-G), averaged over samples.

    ĝ is the gradient of the mean loss on labels ŷ ~ softmax(logits) at the N scored positions; one
    forward and 1 + samples backwards.

    Returns:
        (loss, g, h) as in :func:`hutchinson_diagonal`.
    """
    names, leaves = list(params), list(params.values())
    logits = objective.logits_fn(params, objective.inputs)  # (b, ..., C)
    loss = objective.loss_from_logits(logits, objective.labels)
    grads = torch.autograd.grad(loss, leaves, retain_graph=True)
    scored = objective.labels != IGNORE_INDEX  # (b, ...)
    count = int(scored.sum())
    flat = logits.detach().reshape(-1, logits.shape[-1])
    probs = torch.softmax(flat if flat.dtype == torch.float64 else flat.float(), dim=-1)  # (N, C)
    h = [torch.zeros_like(p) for p in leaves]
    for sample in range(samples):
        drawn = torch.multinomial(probs, 1, generator=generator).reshape(scored.shape)
        sampled = torch.where(scored, drawn, torch.full_like(drawn, IGNORE_INDEX))
        sampled_loss = objective.loss_from_logits(logits, sampled)
        ghat = torch.autograd.grad(sampled_loss, leaves, retain_graph=sample < samples - 1)
        for acc, gi in zip(h, ghat, strict=True):
            acc.addcmul_(gi, gi, value=float(count))
    g = {n: t.detach() for n, t in zip(names, grads, strict=True)}
    return loss.detach(), g, {n: t / samples for n, t in zip(names, h, strict=True)}


def fisher_diagonal(objective: CrossEntropyObjective, params: Params, chunk: int) -> Params:
    """Empirical Fisher diagonal from per-example gradients: h = (1/b') Σ_n T_n ∇ℓ_n ⊙ ∇ℓ_n.

    Per-example gradients come from ``torch.func.vmap(grad(example_loss))`` over ``chunk`` examples at
    a time (memory chunk · d). Examples with no scored token are skipped (b' counts the others).
    """
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


def batch_statistics(
    objective: CrossEntropyObjective,
    params: Params,
    estimator: str,
    generator: torch.Generator,
    *,
    hutchinson_probes: int = 1,
    gnb_samples: int = 1,
    fisher_chunk: int = 8,
) -> BatchStatistics:
    """Loss, g and h of one batch for a Taylor-path estimator (all but ``lookahead``).

    Args:
        objective: the batch's loss as a function of the parameters.
        params: name → leaf tensor with requires_grad (only the parameters that take part).
        estimator: first_order, fisher, gnb or hutchinson (see the module docstring).
        generator: source of probes / sampled labels, on the parameters' device.

    Returns:
        BatchStatistics; ``finite`` is False (and nothing raises) when the loss, g or h has a NaN/inf.
    """
    leaves = list(params.values())
    if estimator == "hutchinson":
        loss, g, h = hutchinson_diagonal(objective.loss, params, hutchinson_probes, generator)
    elif estimator == "gnb":
        loss, g, h = gnb_diagonal(objective, params, gnb_samples, generator)
    elif estimator in ("first_order", "fisher"):
        loss = objective.loss(params)
        g = dict(zip(params, torch.autograd.grad(loss, leaves), strict=True))
        loss = loss.detach()
        h = fisher_diagonal(objective, params, fisher_chunk) if estimator == "fisher" else None
    else:
        raise ValueError(f"batch_statistics: estimator {estimator!r} has no per-batch statistics")
    finite = bool(torch.isfinite(loss)) and all_finite(g) and all_finite(h)
    return BatchStatistics(loss=float(loss), grad=g, hdiag=h, finite=finite)


@torch.no_grad()
def _losses(objectives: Sequence[CrossEntropyObjective], params: Params) -> torch.Tensor:
    return torch.stack([obj.loss(params) for obj in objectives])


def lookahead_influence(
    objectives: Sequence[CrossEntropyObjective],
    params: Params,
    gamma: float,
    rows: Sequence[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Exact look-ahead influence I[i→j] = ℓ(B_j; θ − γ g_i) − ℓ(B_j; θ) (ARCHITECTURE.md §1, the paper's definition).

    Only the parameters in ``params`` take the step (the same ones the Taylor path differentiates).
    Cost: one backward per row plus (rows + 1) · L forwards. Use float64 when γ is small: the entries
    are differences of losses.

    Args:
        objectives: the L batches (probe sub-batches) B_1..B_L.
        params: name → leaf tensor with requires_grad.
        gamma: step γ.
        rows: which i to compute (default all L), to split the L rows across workers.

    Returns:
        (A_rows, losses, row_finite): A_rows (R, L) with A_rows[r, j] = I[rows[r] → j] (NaN where a
        loss is not finite); losses (L,) ℓ(B_j; θ); row_finite (R,) whether g_i was finite.
    """
    rows = list(range(len(objectives))) if rows is None else list(rows)
    base = _losses(objectives, params)  # (L,)
    out = torch.full((len(rows), len(objectives)), float("nan"), dtype=base.dtype, device=base.device)
    row_finite = torch.zeros(len(rows), dtype=torch.bool)
    leaves = list(params.values())
    for r, i in enumerate(rows):
        g = torch.autograd.grad(objectives[i].loss(params), leaves)
        row_finite[r] = all_finite(list(g))
        if not row_finite[r]:
            continue
        stepped = {n: p.detach() - gamma * gi for (n, p), gi in zip(params.items(), g, strict=True)}
        out[r] = _losses(objectives, stepped) - base
    return out, base, row_finite


def taylor_influence(
    objectives: Sequence[CrossEntropyObjective], params: Params, gamma: float
) -> torch.Tensor:
    """Second-order Taylor influence with the exact Hessian: A[i, j] = −γ⟨g_i, g_j⟩ + (γ²/2) g_iᵀ H_j g_i.

    L gradients plus L² Hessian-vector products; a diagnostic that separates the Taylor truncation
    from the diagonal approximation of the estimators. Returns A (L, L).
    """
    leaves = list(params.values())
    grads = []
    for obj in objectives:
        grads.append([t.detach() for t in torch.autograd.grad(obj.loss(params), leaves)])
    flat = torch.stack([torch.cat([t.reshape(-1) for t in g]) for g in grads])  # (L, d)
    A = -gamma * (flat @ flat.T)
    for j, obj in enumerate(objectives):
        g_j = torch.autograd.grad(obj.loss(params), leaves, create_graph=True)
        for i in range(len(objectives)):
            hv = torch.autograd.grad(g_j, leaves, grad_outputs=grads[i], retain_graph=True)
            quad = sum((a * b).sum() for a, b in zip(grads[i], hv, strict=True))
            A[i, j] += 0.5 * gamma**2 * quad
    return A
