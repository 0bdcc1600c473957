"""The AdamW drift w and each batch's potential f_i = ⟨g_i, w⟩ on named tensors (eqs. P1-P2 of potential.py).

w is built once per chunk from the snapshot (θ, m, v, t); it is elementwise, so a rank holding slices
of θ, m, v builds its slice of w with no communication, and f_i is the sum over ranks of the slices'
dot products (one all-reduce of the chunk's L parts, in ``chunk.sketch_chunk``). The dot products run in float64.
"""

from __future__ import annotations

import logging
import math

import torch

from d3ray.influence.optimizer import AdamWState

logger = logging.getLogger(__name__)

__all__ = ["batch_potential", "drift_direction", "drift_residual"]

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
