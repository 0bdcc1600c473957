"""The settled read-out: the weights a branch is heading to once AdamW's momentum has drained.

Right after a chunk, AdamW has applied only part of each batch's gradient: the gradient g_s enters step
t ≥ s with weight (1 − β1)·β1^(t−s) (Loshchilov & Hutter 2019, Alg. 2), so the last batch has had 10% of its
update at β1 = 0.9 and the first 57% at L = 8 (:func:`d3ray.census.stats.momentum_applied`). A held-out
loss read then measures mostly *when* each batch was trained (a first-order effect, in η), not how the
batches interact (D3's S, second order). The settled read-out removes the lag: it evaluates at

    θ_settled = θ − Σ_{k=1..K} η · m̂_{t+k} / (√v̂_{t+k} + ε),
    m̂_{t+k} = β1^k·m_t / (1 − β1^(t+k)),   v̂_{t+k} = β2^k·v_t / (1 − β2^(t+k)),

the K further AdamW steps the optimizer would take on zero gradients at the current learning rate η
(weight decay left out: it shrinks every branch's weights alike and is not pending from the chunk). After
K = 50 steps at β1 = 0.9 every batch of the chunk has had more than 99% of its update. The branch itself
is not changed: a persist read-out continues from the unsettled state.
"""

from __future__ import annotations

import torch


def pending_update(m: torch.Tensor, v: torch.Tensor, step: int, lr: float, beta1: float, beta2: float, eps: float,
                   steps: int) -> torch.Tensor:
    """Σ_{k=1..steps} lr · m̂_{step+k} / (√v̂_{step+k} + eps) for AdamW moments ``m``, ``v`` after ``step``
    optimizer steps and zero gradients from then on (the module docstring's equation): the displacement
    to subtract from the weights. Zero for ``steps`` = 0.

    Raises:
        ValueError: ``steps`` < 0, ``step`` < 1 (no moments yet) or β outside [0, 1).
    """
    if steps < 0 or step < 1:
        raise ValueError(f"pending_update: steps {steps} must be >= 0 and the optimizer step {step} >= 1")
    if not (0.0 <= beta1 < 1.0 and 0.0 <= beta2 < 1.0):
        raise ValueError(f"pending_update: betas ({beta1}, {beta2}) must lie in [0, 1)")
    m64, v64 = m.double(), v.double()
    total = torch.zeros_like(m64)
    for k in range(1, steps + 1):
        m_hat = beta1**k * m64 / (1.0 - beta1 ** (step + k))
        v_hat = beta2**k * v64 / (1.0 - beta2 ** (step + k))
        total += lr * m_hat / (v_hat.sqrt() + eps)
    return total.to(m.dtype)
