"""The settled read-out's displacement (d3ray/census/settle.py) against torch's own AdamW stepping on zero
gradients from the same moments, at a young optimizer (bias corrections matter) and an old one."""

from __future__ import annotations

import pytest
import torch

from d3ray.census.settle import pending_update


@pytest.mark.parametrize("step, steps", [(3, 5), (200, 50), (7, 0)])
def test_pending_update_equals_torch_adamw_on_zero_gradients(step, steps):
    gen = torch.Generator().manual_seed(step)
    theta = torch.randn(6, 5, generator=gen, dtype=torch.float64)
    m = 0.01 * torch.randn(6, 5, generator=gen, dtype=torch.float64)
    v = 1e-4 * torch.rand(6, 5, generator=gen, dtype=torch.float64)
    p = torch.nn.Parameter(theta.clone())
    opt = torch.optim.AdamW([p], lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    opt.state[p] = {"step": torch.tensor(float(step), dtype=torch.float64), "exp_avg": m.clone(), "exp_avg_sq": v.clone()}
    for _ in range(steps):
        p.grad = torch.zeros_like(p)
        opt.step()
    moved = pending_update(m, v, step, 3e-3, 0.9, 0.95, 1e-8, steps)
    torch.testing.assert_close(theta - moved, p.detach(), rtol=1e-12, atol=1e-14)
    if steps:
        assert moved.abs().max() > 1e-4  # the momentum does move the weights


def test_pending_update_drains_geometrically_and_refuses_bad_input():
    m, v = torch.full((3,), 0.02), torch.full((3,), 4e-4)
    # old optimizer (bias corrections 1), β2 → 1: each step lr·β1^k·m/(√v + ε): the sum tends to lr·m/√v·β1/(1 − β1)
    far = pending_update(m, v, 10**9, 1e-3, 0.9, 0.999999, 0.0, 400)
    assert far.double() == pytest.approx([1e-3 * 0.02 / 0.02 * 9.0] * 3, rel=1e-3)
    with pytest.raises(ValueError, match="optimizer step 0"):
        pending_update(m, v, 0, 1e-3, 0.9, 0.999, 1e-8, 5)
    with pytest.raises(ValueError, match="betas"):
        pending_update(m, v, 5, 1e-3, 1.0, 0.999, 1e-8, 5)
