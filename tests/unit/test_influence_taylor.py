"""The Taylor form against the exact look-ahead, with the plain step −γ·g and with the AdamW step.

- On a tiny float64 GPT-2, the second-order Taylor influence with the exact Hessian differs from the
  exact look-ahead by a third-order remainder: halving the step divides the error by 2³ = 8
  (a second-order bug would give 4), for the plain step and for the preconditioned (AdamW) step.
- On objectives whose Hessian is diagonal, one Hutchinson probe is exact (z ⊙ D z = D since z² = 1),
  so the production path (estimator → step → identity sketch → A, S) must equal the exact-Hessian
  Taylor form to rounding, for both steps: no threshold near a noise floor.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from d3ray.influence import AdamWState, IdentitySketchConfig, InfluenceConfig
from d3ray.influence.chunk import sketch_chunk
from d3ray.influence.estimators import HutchinsonConfig, LookaheadConfig
from d3ray.influence.optimizer import step_direction
from d3ray.influence.statistics import CrossEntropyObjective, batch_gradient, taylor_influence
from d3ray.influence.worker import InfluenceWorker

MODEL = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=16).to_dict()
IDS = [0, 1, 2, 3]


def _adam_state(shapes: dict[str, tuple], lr: float, seed: int = 0) -> AdamWState:
    rng = np.random.default_rng(seed)
    return AdamWState(
        lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, step=7,
        exp_avg={n: rng.normal(size=s) * 1e-2 for n, s in shapes.items()},
        exp_avg_sq={n: rng.random(size=s) * 1e-4 for n, s in shapes.items()},
    )


def _steps(objectives, params, preconditioner: str, size: float, state: AdamWState | None) -> list[dict]:
    """Δθ_i of each batch: −size·g_i, or the AdamW step from ``state`` (whose lr is ``size``)."""
    moments = state.tensors(params, torch.device("cpu"), torch.float64) if state is not None else None
    out = []
    for obj in objectives:
        _, g = batch_gradient(obj, params)
        eta, u = step_direction(preconditioner, size, params, g, state, moments)
        out.append({n: -eta * t for n, t in u.items()})
    return out


@pytest.fixture(scope="module")
def gpt2():
    """A random-init float64 worker, its weights, and four batches of banded token ids."""
    rng = np.random.default_rng(0)
    batches = []
    for _ in IDS:
        lo = rng.integers(0, 48)
        batches.append(rng.integers(lo, lo + 16, size=(3, 12)))
    torch.manual_seed(0)
    worker = InfluenceWorker(MODEL, InfluenceConfig(estimator=LookaheadConfig(), dtype="float64", device="cpu"))
    weights = {k: v.detach().float().numpy() for k, v in worker.model.state_dict().items()}
    return worker, weights, batches


@pytest.mark.parametrize("preconditioner", ["none", "adam"])
def test_taylor_minus_lookahead_shrinks_like_step_cubed(gpt2, preconditioner):
    worker, weights, batches = gpt2
    shapes = {n: tuple(p.shape) for n, p in worker.model.named_parameters()}
    errors = []
    for size in (1e-3, 5e-4, 2.5e-4):
        config = InfluenceConfig(
            estimator=LookaheadConfig(), preconditioner=preconditioner, gamma=size, dtype="float64", device="cpu"
        )
        state = _adam_state(shapes, lr=size) if preconditioner == "adam" else None
        look = InfluenceWorker(MODEL, config)
        A_look = look.lookahead_matrix([weights, state] if state else weights, batches, IDS).A_rows
        params = look.leaves()
        objectives = [look.objective(b, i) for b, i in zip(batches, IDS, strict=True)]
        A_taylor = taylor_influence(objectives, params, _steps(objectives, params, preconditioner, size, state))
        errors.append(np.abs(A_look - A_taylor.detach().numpy()).max())

    orders = np.log2(np.array(errors[:-1]) / np.array(errors[1:]))
    # Third-order remainder: each halving divides the error by 8 (measured log2 ratios 2.9-3.0).
    np.testing.assert_allclose(orders, 3.0, atol=0.15)


def _one_hot_batches(d: int, n_batches: int, b: int, seed: int) -> list[CrossEntropyObjective]:
    """Binary logistic losses whose logit for example n is w[c_n]: the Hessian of each batch is diagonal."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_batches):
        x = torch.nn.functional.one_hot(torch.tensor(rng.integers(0, d, size=b)), d).double()  # (b, d)
        y = torch.tensor(rng.integers(0, 2, size=b))

        def logits(p, inputs):
            z = inputs @ p["w"]  # (b,)
            return torch.stack([torch.zeros_like(z), z], dim=-1)  # (b, 2)

        out.append(CrossEntropyObjective(logits_fn=logits, inputs=x, labels=y))
    return out


@pytest.mark.parametrize("preconditioner", ["none", "adam"])
def test_hutchinson_on_diagonal_hessians_equals_exact_hessian_taylor(preconditioner):
    d = 6
    objectives = _one_hot_batches(d, n_batches=4, b=10, seed=1)
    params = {"w": torch.tensor(np.random.default_rng(2).normal(size=d), requires_grad=True)}
    state = _adam_state({"w": (d,)}, lr=0.05) if preconditioner == "adam" else None
    config = InfluenceConfig(
        estimator=HutchinsonConfig(probes=1), preconditioner=preconditioner, gamma=0.05,
        sketch=IdentitySketchConfig(), control_variate=False, dtype="float64", device="cpu",
    )
    stats = [
        config.estimator.statistics(obj, params, torch.Generator().manual_seed(i))
        for i, obj in enumerate(objectives)
    ]

    sketches = sketch_chunk(stats, IDS, params, config, config.sketch.build(), optimizer=state)
    A, S, _ = config.estimator.merge([sketches], IDS)

    A_exact = taylor_influence(objectives, params, _steps(objectives, params, preconditioner, 0.05, state))
    A_exact = A_exact.detach().numpy()
    np.testing.assert_allclose(A, A_exact, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(S, A_exact.T - A_exact, rtol=1e-10, atol=1e-15)
    # the asymmetry to be matched stands far above the rounding level of A
    assert np.abs(S).max() > 1e6 * np.finfo(np.float64).eps * np.abs(A_exact).max()
