"""The AdamW drift w and each batch's potential f_i = ⟨g_i, w⟩ on named tensors (eqs. P1-P2 of potential.py).

w is built once per chunk from the snapshot (θ, m, v, t); it is elementwise, so a rank holding slices
of θ, m, v builds its slice of w with no communication, and f_i is the sum over ranks of the slices'
dot products (one all-reduce of the chunk's L parts, in ``chunk.sketch_chunk``). The dot products run in float64.

Without a sketched residual nothing but f_i is needed from batch i, and f_i is a directional
derivative, f_i = ⟨∇ℓ_i(θ), w⟩ = d/dε ℓ_i(θ + ε·w) at ε = 0 (eq. P2), so :func:`batched_potentials`
computes it for the sampled sequences of many batches in one pass, without any per-batch gradient:
by forward-mode AD (a Jacobian-vector product, ``torch.func.jvp``), or as the loss change of the drift
step itself, (ℓ_i(θ) − ℓ_i(θ − η·w)) / η (two plain forwards).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from d3ray.influence.optimizer import AdamWState
from d3ray.influence.statistics import IGNORE_INDEX

if TYPE_CHECKING:
    from d3ray.influence.statistics import CrossEntropyObjective

logger = logging.getLogger(__name__)

__all__ = ["batch_potential", "batched_potentials", "drift_direction", "drift_residual"]

Params = dict[str, torch.Tensor]


def drift_direction(params: Params, state: AdamWState, moments: tuple[Params, Params]) -> Params:
    """w = λθ + β1·m ⊘ (b1·(√(β2·v / b2) + ε)) (eq. P1): the batch-independent part of the AdamW direction.

    Args:
        params: name → θ (this rank's slices under sharding).
        state: hyperparameters and step count t (bias corrections at t + 1, as ``adamw_direction``).
        moments: (m, v) of the same names (:meth:`AdamWState.tensors`).
    """
    b1, b2 = state.betas
    t = state.step + 1
    bc1, bc2_sqrt = 1.0 - b1**t, math.sqrt(1.0 - b2**t)
    m0, v0 = moments
    out = {}
    for name, theta in params.items():
        denom = ((v0[name] * b2).sqrt() / bc2_sqrt + state.eps) * bc1
        out[name] = theta.detach() * state.weight_decay + m0[name] * b1 / denom
    return out


def drift_residual(u: Params, w: Params) -> Params:
    """s_i = u_i − w: batch i's own part of its step direction (what the residual sketch carries)."""
    return {n: t - w[n] for n, t in u.items()}


def batch_potential(grad: Params, w: Params) -> float:
    """f_i = ⟨g_i, w⟩ in float64 over the parameters of ``grad`` (this rank's part when they are slices:
    ``sketch_chunk`` sums the chunk's parts over ranks in one all-reduce)."""
    total = torch.zeros((), dtype=torch.float64, device=next(iter(w.values())).device)
    for name, g in grad.items():
        total = total + torch.dot(g.reshape(-1).double(), w[name].reshape(-1).double())
    return float(total)


def batched_potentials(
    objectives: Sequence[CrossEntropyObjective],
    params: Params,
    w: Params | Callable[[], Params],
    tokens_per_pass: int = 512,
    method: str = "jvp",
    step_size: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(losses ℓ_i, potentials f_i) of every batch from batched forward passes, many batches per pass.

    ``method``:
      - ``jvp``: f_i = ⟨∇ℓ_i(θ), w⟩ = d/dε ℓ_i(θ + ε·w) at ε = 0 (eq. P2) by forward-mode AD
        (``torch.func.jvp``): the same f as ``batch_potential`` gets from the gradient, to rounding.
      - ``step``: f_i = (ℓ_i(θ) − ℓ_i(θ − η·w)) / η, η = ``step_size``: what the drift part of the AdamW
        step, −η·w, really does to batch i's loss (the exact look-ahead of the potential term, with
        no Taylor truncation; ``step`` → ``jvp`` as η → 0). Two plain forwards, no derivative at all.

    ℓ_i is the objective's own loss (the mean cross-entropy over the scored positions of its sampled
    sequences): per pass the token losses are summed per sequence, and the sums of a batch's sequences
    divided by its count of scored positions. Sequences of equal length are stacked, at most
    ``tokens_per_pass`` tokens a pass (one sequence at least). ``jvp`` runs attention in PyTorch's math
    kernel: the fused SDPA kernels have no forward-mode derivative.

    Args:
        objectives: the batches; all share one ``logits_fn`` (the worker's model).
        params: name → θ (the parameters that take part).
        w: name → the drift of eq. P1, same names and dtype as ``params``; or a function that returns it,
            called once, after the forwards at θ under ``step`` (the trainers' w is still crossing the ranks
            while they run: ``train/scheduling/snapshot.py: gathered_drift``).
        tokens_per_pass: bound on the tokens of one pass (its logits, and their tangents for ``jvp``).
        method: ``jvp`` or ``step``.
        step_size: η > 0, for ``step`` (the optimizer's learning rate).

    Returns:
        (L,) float64 losses and (L,) float64 potentials; NaN/inf where a batch scores no position or
        its loss or potential is not finite (the caller excludes it).

    Raises:
        ValueError: objectives of different models, an unknown method, or ``step`` without η > 0.
    """
    from torch.func import jvp
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if len({o.logits_fn for o in objectives}) > 1:
        raise ValueError("batched_potentials: the objectives must share one logits_fn (one model)")
    if method not in ("jvp", "step"):
        raise ValueError(f"batched_potentials: method must be 'jvp' or 'step', got {method!r}")
    if method == "step" and not (step_size is not None and step_size > 0):
        raise ValueError(f"batched_potentials: method 'step' needs a step size > 0, got {step_size!r}")
    n = len(objectives)
    loss_sum, potential_sum, count = np.zeros(n), np.zeros(n), np.zeros(n)
    primal = {name: t.detach() for name, t in params.items()}
    passes = list(_passes(objectives, tokens_per_pass))

    def row_losses(inputs: torch.Tensor, labels: torch.Tensor, logits_fn):
        def losses(p: Params) -> torch.Tensor:
            logits = logits_fn(p, inputs)
            token = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                    ignore_index=IGNORE_INDEX, reduction="none")
            return token.reshape(inputs.shape[0], -1).sum(dim=1)  # (rows,) summed token losses
        return losses

    losses_of = [row_losses(inputs, labels, objectives[int(owners[0])].logits_fn) for owners, inputs, labels in passes]
    if method == "jvp":
        tangent = {name: (w() if callable(w) else w)[name] for name in params}
        with sdpa_kernel(SDPBackend.MATH), _builtin_linear():
            results = [jvp(losses, (primal,), (tangent,)) for losses in losses_of]
    else:
        with torch.no_grad():
            at_theta = [losses(primal) for losses in losses_of]  # no w needed yet
            drift = w() if callable(w) else w
            moved = {name: t - step_size * drift[name] for name, t in primal.items()}  # θ − η·w
            results = [(sums, (sums - losses(moved)) / step_size) for sums, losses in zip(at_theta, losses_of, strict=True)]
    for (owners, _, labels), (sums, derivative) in zip(passes, results, strict=True):
        np.add.at(loss_sum, owners, sums.detach().double().cpu().numpy())
        np.add.at(potential_sum, owners, derivative.detach().double().cpu().numpy())
        np.add.at(count, owners, (labels != IGNORE_INDEX).reshape(len(owners), -1).sum(dim=1).cpu().numpy())
    with np.errstate(invalid="ignore", divide="ignore"):
        nothing = np.where(count > 0, 1.0, np.nan)  # a batch with no scored position: NaN, as its mean loss
        return loss_sum / np.maximum(count, 1) * nothing, potential_sum / np.maximum(count, 1) * nothing


@contextlib.contextmanager
def _builtin_linear():
    """``torch.nn.functional.linear`` as PyTorch ships it, for the duration of a forward-mode pass.

    DeepSpeed's ZeRO-3 ``Init`` replaces it process-wide with an autograd.Function that has no forward-mode
    rule ("This will persist unless manually reset"), e.g. in a process that trained a ZeRO-3 engine before
    it scores (a census worker, a test session). The influence model is a plain module, so its pass takes
    the builtin and the replacement is put back afterwards.
    """
    current = F.linear
    if current is torch._C._nn.linear:
        yield
        return
    F.linear = torch._C._nn.linear
    try:
        yield
    finally:
        F.linear = current


def _passes(objectives: Sequence[CrossEntropyObjective], tokens_per_pass: int):
    """(owner batch per row, inputs, labels) of each pass: the objectives' sequences grouped by shape,
    at most ``tokens_per_pass`` tokens (one sequence at least) a pass."""
    groups: dict[tuple, list[tuple[int, int]]] = {}  # (input shape, label shape) → [(batch, row)]
    for b, obj in enumerate(objectives):
        for r in range(obj.inputs.shape[0]):
            groups.setdefault((tuple(obj.inputs.shape[1:]), tuple(obj.labels.shape[1:])), []).append((b, r))
    for (shape, _), rows in groups.items():
        per_pass = max(1, tokens_per_pass // max(1, math.prod(shape)))
        for start in range(0, len(rows), per_pass):
            part = rows[start : start + per_pass]
            yield (np.array([b for b, _ in part]), torch.stack([objectives[b].inputs[r] for b, r in part]),
                   torch.stack([objectives[b].labels[r] for b, r in part]))
