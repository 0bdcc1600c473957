"""The drift potential by batched forward-mode AD (drift.batched_potentials, chunk.potential_chunk): the same
losses and f_i = ⟨g_i, w⟩ as one forward + backward per batch, whatever the passes' grouping."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from d3ray.influence import AdamWState, InfluenceConfig
from d3ray.influence.drift import batch_potential, batched_potentials, drift_direction
from d3ray.influence.estimators import DriftConfig
from d3ray.influence.statistics import gradient_statistics
from d3ray.influence.worker import InfluenceWorker

MODEL = transformers.GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=64, n_positions=32).to_dict()


def _state(worker: InfluenceWorker, seed: int = 5) -> AdamWState:
    rng = np.random.default_rng(seed)
    shapes = {n: tuple(p.shape) for n, p in worker.model.named_parameters()}
    return AdamWState(
        lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, step=7,
        exp_avg={n: rng.normal(size=s) * 1e-2 for n, s in shapes.items()},
        exp_avg_sq={n: rng.random(size=s) * 1e-4 for n, s in shapes.items()},
    )


def _batches() -> list:
    """Two sequence lengths (two groups of passes), one batch with masked labels, one scoring nothing."""
    rng = np.random.default_rng(11)
    long = [rng.integers(0, 64, size=(4, 20)) for _ in range(3)]
    short = [rng.integers(0, 64, size=(4, 9)) for _ in range(2)]
    masked = np.where(rng.random(size=(4, 20)) < 0.4, -100, long[1])
    return [long[0], (long[1], masked), short[0], long[2], short[1], (long[0], np.full_like(long[0], -100))]


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("tokens_per_pass", [1, 50, 4096])
def test_batched_potentials_equal_the_gradient_dot_products(attention, tokens_per_pass):
    config = InfluenceConfig(preconditioner="adam", dtype="float64", device="cpu", sample_fraction=0.5, seed=2)
    worker = InfluenceWorker(MODEL, config, attn_implementation=attention)
    state = _state(worker)
    params = worker.leaves()
    w = drift_direction(params, state, state.tensors(params, torch.device("cpu"), torch.float64))
    batches = _batches()
    objectives = [worker.objective(b, i) for i, b in enumerate(batches)]

    losses, f = batched_potentials(objectives, params, w, tokens_per_pass)

    for i, obj in enumerate(objectives[:-1]):
        st = gradient_statistics(obj, params)
        assert losses[i] == pytest.approx(st.loss, rel=1e-12)
        assert f[i] == pytest.approx(batch_potential(st.grad, w), rel=1e-9, abs=1e-12)
    assert np.isnan(losses[-1]) and np.isnan(f[-1])  # nothing scored: NaN, as the mean loss is
    assert len(set(np.round(f[:-1], 12))) == len(f) - 1  # distinct batches, distinct f: nothing was mixed up


def test_step_potential_is_the_drift_steps_loss_change_and_tends_to_the_derivative():
    config = InfluenceConfig(preconditioner="adam", dtype="float64", device="cpu", sample_fraction=0.5, seed=2)
    worker = InfluenceWorker(MODEL, config, attn_implementation="sdpa")
    state = _state(worker)
    params = worker.leaves()
    w = drift_direction(params, state, state.tensors(params, torch.device("cpu"), torch.float64))
    objectives = [worker.objective(b, i) for i, b in enumerate(_batches()[:-1])]
    _, f_jvp = batched_potentials(objectives, params, w, 64, "jvp")
    moved = {n: p.detach() - 1e-2 * w[n] for n, p in params.items()}

    losses, f_step = batched_potentials(objectives, params, w, 64, "step", step_size=1e-2)
    for i, obj in enumerate(objectives):  # written out: (ℓ_i(θ) − ℓ_i(θ − η·w)) / η, batch by batch
        with torch.no_grad():
            before, after = float(obj.loss(params)), float(obj.loss(moved))
        assert f_step[i] == pytest.approx((before - after) / 1e-2, rel=1e-9)
        assert losses[i] == pytest.approx(before, rel=1e-12)
    errors = [np.abs(batched_potentials(objectives, params, w, 64, "step", step_size=eta)[1] - f_jvp).max()
              for eta in (1e-3, 1e-4)]
    assert errors[1] < 0.2 * errors[0]  # O(η): the curvature along w, 10x smaller at a 10x smaller step
    with pytest.raises(ValueError, match="step size"):
        batched_potentials(objectives, params, w, 64, "step", step_size=0.0)


def test_worker_potential_paths_give_the_same_potential_and_exclusions():
    batches = _batches()
    ids = list(range(10, 10 + len(batches)))
    parts, snapshot = {}, None
    for potential in ("jvp", "gradient", "step"):
        config = InfluenceConfig(estimator=DriftConfig(potential=potential), preconditioner="adam",
                                 dtype="float64", device="cpu", sample_fraction=0.5, seed=2)
        worker = InfluenceWorker(MODEL, config)
        if snapshot is None:  # one snapshot for both workers (each builds its model with fresh weights)
            snapshot = [{k: v.detach().double().numpy() for k, v in worker.model.state_dict().items()}, _state(worker)]
        parts[potential] = worker.sketch_batches(snapshot, batches, ids)
        assert parts[potential].G.shape == (len(ids), 0)
    jvp, grad = parts["jvp"], parts["gradient"]

    assert jvp.excluded == grad.excluded == [ids[-1]]
    np.testing.assert_allclose(jvp.potential, grad.potential, rtol=1e-9, atol=1e-14)
    np.testing.assert_allclose(jvp.losses[:-1], grad.losses[:-1], rtol=1e-12)
    assert jvp.sketch_id == grad.sketch_id and jvp.step_size == grad.step_size
    # step: the drift step's loss change at the snapshot's lr (O(lr) from the derivative), what the pure function gives
    worker.load_weights(snapshot)
    params, state = worker.leaves(), snapshot[1]
    w = drift_direction(params, state, state.tensors(params, torch.device("cpu"), torch.float64))
    objectives = [worker.objective(b, i) for b, i in zip(batches, ids, strict=True)]
    f_step = batched_potentials(objectives, params, w, 4096, "step", step_size=state.lr)[1]
    assert parts["step"].excluded == [ids[-1]]
    np.testing.assert_allclose(parts["step"].potential[:-1], f_step[:-1], rtol=1e-12)
    config = InfluenceConfig(preconditioner="adam")
    np.testing.assert_allclose(config.estimator.merge([jvp], ids)[1], config.estimator.merge([grad], ids)[1],
                               rtol=1e-9, atol=1e-18)


def test_drift_config_refuses_unknown_potential_and_empty_passes():
    with pytest.raises(ValueError, match="drift.potential"):
        DriftConfig(potential="finite_difference")
    with pytest.raises(ValueError, match="drift.tokens_per_pass"):
        DriftConfig(tokens_per_pass=0)
    assert DriftConfig().batches_potential and not DriftConfig(residual="sketch").batches_potential


def test_jvp_runs_where_deepspeed_zero3_replaced_functional_linear(monkeypatch):
    """ZeRO-3 swaps F.linear for an autograd.Function without a forward-mode rule, process-wide; the
    influence model's pass takes the builtin and leaves the swap in place."""
    import torch.nn.functional as F

    class NoForwardMode(torch.autograd.Function):  # like deepspeed's LinearFunctionForZeroStage3
        @staticmethod
        def forward(x, weight, bias=None):
            return torch._C._nn.linear(x, weight, bias)

        @staticmethod
        def setup_context(ctx, inputs, output):
            pass

        @staticmethod
        def backward(ctx, grad):
            raise NotImplementedError

    def replaced(x, weight, bias=None):
        return NoForwardMode.apply(x, weight, bias)

    monkeypatch.setattr(F, "linear", replaced)
    config = InfluenceConfig(preconditioner="adam", dtype="float64", device="cpu", sample_fraction=0.5, seed=2)
    worker = InfluenceWorker(MODEL, config)
    state = _state(worker)
    params = worker.leaves()
    w = drift_direction(params, state, state.tensors(params, torch.device("cpu"), torch.float64))
    objectives = [worker.objective(b, i) for i, b in enumerate(_batches()[:2])]
    with pytest.raises(NotImplementedError, match="jvp"):  # what the replacement does to forward mode by itself
        torch.func.jvp(lambda x: F.linear(x, torch.ones(2, 2, dtype=torch.float64)),
                       (torch.ones(2, dtype=torch.float64),), (torch.ones(2, dtype=torch.float64),))

    _, f = batched_potentials(objectives, params, w, 4096, "jvp")

    for i, obj in enumerate(objectives):
        with monkeypatch.context() as m:
            m.setattr(F, "linear", torch._C._nn.linear)
            st = gradient_statistics(obj, params)
        assert f[i] == pytest.approx(batch_potential(st.grad, w), rel=1e-9)
    assert F.linear is replaced
