"""The exact drift potential (d3ray/influence/potential.py, drift.py, the ``drift`` estimator): hand-worked
small cases of eqs. P1-P3, and the production path against the full-dimension first-order S of the
AdamW step on a tiny float64 GPT-2."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import transformers

from d3ray.influence import AdamWState, IdentitySketchConfig, InfluenceConfig
from d3ray.influence.estimators import DriftConfig, FirstOrderConfig
from d3ray.influence.optimizer import adamw_direction
from d3ray.influence.potential import combine, drift_potential, potential_antisymmetric
from d3ray.influence.worker import InfluenceWorker
from d3ray.solver.problem import ordering_cost

MODEL = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=16).to_dict()
IDS = [3, 4, 5, 6, 7]


def test_drift_potential_three_batches_gives_hand_computed_f_and_S():
    grads = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    w = np.array([3.0, -1.0])
    f = drift_potential(grads, w)  # ⟨g_i, w⟩ = 3, −2, 2
    S = potential_antisymmetric(f, step_size=0.5)  # S[i, j] = 0.5·(f_j − f_i)

    assert f.tolist() == [3.0, -2.0, 2.0]
    assert S.tolist() == [[0.0, -2.5, -0.5], [2.5, 0.0, 2.0], [0.5, -2.0, 0.0]]
    assert np.array_equal(S, -S.T)
    # ascending f (1, 2, 0) violates no positive weight: the LOP optimum
    assert ordering_cost(S, np.array([1, 2, 0])) == 0.0
    assert ordering_cost(S, np.array([0, 2, 1])) == 5.0  # descending f: 2.5 + 0.5 + 2.0, every pair backwards
    assert ordering_cost(S, np.array([0, 1, 2])) == 3.0  # 0 after 1 and after 2: 2.5 + 0.5


def test_combine_adds_the_residual_and_keeps_exact_antisymmetry():
    rng = np.random.default_rng(0)
    R = rng.normal(size=(4, 4))
    S = combine(potential_antisymmetric(rng.normal(size=4), 1e-3), R - R.T)

    assert np.array_equal(S, -S.T)
    with pytest.raises(ValueError, match="combine"):
        combine(np.zeros((3, 3)), np.zeros((4, 4)))
    with pytest.raises(ValueError, match="drift_potential"):
        drift_potential(np.zeros((2, 3)), np.zeros(2))


def test_drift_decomposition_one_coordinate_matches_hand_computed_adamw_step():
    """u = w + s (eq. P1) on one coordinate, from the AdamW formula worked by hand."""
    from d3ray.influence.drift import drift_direction

    lr, b1, b2, eps, lam, t = 0.1, 0.5, 0.5, 0.05, 0.25, 1  # bias corrections at t + 1 = 2: 0.75, 0.75
    state = AdamWState(lr=lr, betas=(b1, b2), eps=eps, weight_decay=lam, step=t,
                       exp_avg={"p": np.array([0.375])}, exp_avg_sq={"p": np.array([0.06])})
    theta, g = torch.tensor([2.0], dtype=torch.float64), torch.tensor([0.6], dtype=torch.float64)
    moments = state.tensors(["p"], torch.device("cpu"), torch.float64)

    w = drift_direction({"p": theta}, state, moments)["p"]
    u = adamw_direction({"p": theta}, {"p": g}, state, moments)["p"]

    # d0 = √(0.5·0.06 / 0.75) + 0.05 = 0.25;  w = 0.25·2 + 0.5·0.375 / (0.75·0.25) = 0.5 + 1 = 1.5
    assert float(w) == pytest.approx(1.5, rel=1e-15)
    # d1 = √((0.03 + 0.5·0.36) / 0.75) + 0.05;  u = 0.5 + (0.1875 + 0.3) / (0.75·d1)
    d1 = math.sqrt(0.21 / 0.75) + 0.05
    assert float(u) == pytest.approx(0.5 + 0.4875 / (0.75 * d1), rel=1e-15)
    # s = u − w: batch i's own part, here its g pushes the same way as m
    assert float(u - w) == pytest.approx(0.4875 / (0.75 * d1) - 1.0, rel=1e-14)


@pytest.fixture(scope="module")
def snapshot():
    """A fresh tiny model's weights and a non-trivial AdamW state (clip active: C below the gradients' norms)."""
    worker = InfluenceWorker(MODEL, InfluenceConfig(dtype="float64", device="cpu"))
    weights = {k: v.detach().double().numpy() for k, v in worker.model.state_dict().items()}
    rng = np.random.default_rng(3)
    shapes = {n: tuple(p.shape) for n, p in worker.model.named_parameters()}
    state = AdamWState(
        lr=2e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, step=12, max_grad_norm=0.5,
        exp_avg={n: rng.normal(size=s) * 1e-2 for n, s in shapes.items()},
        exp_avg_sq={n: rng.random(size=s) * 1e-4 for n, s in shapes.items()},
    )
    return [weights, state]


def _batches(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 64, size=(3, 12)) for _ in range(n)]


def _full_dimension(config: InfluenceConfig, snapshot, chunk) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """(G, U, w) flat float64 (L, d), (L, d), (d,) and η, from the worker's statistics without any sketch."""
    worker = InfluenceWorker(MODEL, config)
    worker.load_weights(snapshot)
    params, state = worker.leaves(), snapshot[1]
    moments = state.tensors(params, torch.device("cpu"), torch.float64)
    grads, dirs = [], []
    for b, bid in zip(chunk, IDS, strict=True):
        st = config.estimator.statistics(worker.objective(b, bid), params, worker.generator(bid))
        u = adamw_direction(params, st.grad, state, moments)
        grads.append(torch.cat([st.grad[n].reshape(-1) for n in params]))
        dirs.append(torch.cat([u[n].reshape(-1) for n in params]))
    b1, b2 = state.betas
    bc1, bc2 = 1 - b1 ** (state.step + 1), 1 - b2 ** (state.step + 1)
    w = torch.cat([  # eq. P1 written out on the flat vectors, independently of drift.py
        (params[n].detach() * state.weight_decay
         + b1 * moments[0][n] / (bc1 * ((b2 * moments[1][n] / bc2).sqrt() + state.eps))).reshape(-1)
        for n in params
    ])
    return torch.stack(grads).numpy(), torch.stack(dirs).numpy(), w.numpy(), state.lr


def test_drift_estimator_identity_sketch_equals_full_dimension_first_order_S(snapshot):
    """Exact potential + identity-sketched residual = the first-order S of the AdamW step in full dimension
    (eq. P3 is an identity), and the potential alone = η·(f_j − f_i) with f from eq. P2."""
    base = dict(preconditioner="adam", sketch=IdentitySketchConfig(), sample_fraction=0.67, seed=9,
                dtype="float64", device="cpu", control_variate=False)
    chunk = _batches(len(IDS), seed=4)
    G, U, w, eta = _full_dimension(InfluenceConfig(estimator=FirstOrderConfig(), **base), snapshot, chunk)
    F = U @ G.T  # F[i, j] = ⟨u_i, g_j⟩
    S_full = -eta * (F.T - F)
    f = drift_potential(G, w)

    def production(estimator) -> np.ndarray:
        config = InfluenceConfig(estimator=estimator, **base)
        part = InfluenceWorker(MODEL, config).sketch_batches(snapshot, chunk, IDS)
        return config.estimator.merge([part], IDS)[1]

    S_drift = production(DriftConfig(residual="sketch"))
    S_potential = production(DriftConfig(residual="none", potential="jvp"))  # f_i = d/dε ℓ_i(θ + ε·w), exact
    S_potential_gradient = production(DriftConfig(residual="none", potential="gradient"))
    S_first = production(FirstOrderConfig())
    scale = np.abs(S_full).max()

    np.testing.assert_allclose(S_drift, S_full, rtol=0, atol=1e-12 * scale)
    np.testing.assert_allclose(S_first, S_full, rtol=0, atol=1e-12 * scale)
    np.testing.assert_allclose(S_potential, potential_antisymmetric(f, eta), rtol=0, atol=1e-12 * scale)
    np.testing.assert_allclose(S_potential_gradient, potential_antisymmetric(f, eta), rtol=0, atol=1e-12 * scale)
    assert np.array_equal(S_drift, -S_drift.T) and np.array_equal(S_potential, -S_potential.T)
    # the clip (C = 0.5) makes the residual non-zero: the potential alone is not all of S here
    assert np.abs(S_full - potential_antisymmetric(f, eta)).max() > 1e-6 * scale


def test_drift_estimator_sjlt_residual_with_control_variate_tracks_full_S(snapshot):
    """The production default form (sjlt + control variate) of ``drift``: the potential carries no sketch
    error, so S − S_potential is the sketched residual alone, and a large k recovers the full S."""
    from d3ray.influence import SjltSketchConfig

    base = dict(preconditioner="adam", sample_fraction=0.67, seed=9, dtype="float64", device="cpu")
    chunk = _batches(len(IDS), seed=4)
    G, U, w, eta = _full_dimension(InfluenceConfig(estimator=FirstOrderConfig(), **base), snapshot, chunk)
    F = U @ G.T
    S_full = -eta * (F.T - F)
    S_pot = potential_antisymmetric(drift_potential(G, w), eta)
    config = InfluenceConfig(estimator=DriftConfig(residual="sketch"), sketch=SjltSketchConfig(k=1 << 15, seed=2),
                             **base)
    part = InfluenceWorker(MODEL, config).sketch_batches(snapshot, chunk, IDS)

    np.testing.assert_allclose(part.potential, drift_potential(G, w), rtol=1e-12)
    S = config.estimator.merge([part], IDS)[1]
    residual_err = np.abs((S - S_pot) - (S_full - S_pot)).max()
    assert residual_err < 0.2 * np.abs(S_full - S_pot).max()


def test_drift_estimator_excluded_batch_has_zero_row_and_column(snapshot):
    chunk = _batches(len(IDS), seed=4)
    chunk[2] = (chunk[2], np.full_like(chunk[2], -100))  # no scored label: loss NaN → excluded
    config = InfluenceConfig(preconditioner="adam", dtype="float64", device="cpu")  # default: the potential alone
    part = InfluenceWorker(MODEL, config).sketch_batches(snapshot, chunk, IDS)
    A, S, excluded = config.estimator.merge([part], IDS)

    assert excluded == [IDS[2]]
    assert not S[2].any() and not S[:, 2].any() and not A[2].any() and not A[:, 2].any()
    assert S[np.ix_([0, 1, 3, 4], [0, 1, 3, 4])].any()
    assert part.G.shape == (len(IDS), 0)  # nothing sketched


def test_drift_config_unknown_residual_raises():
    with pytest.raises(ValueError, match="drift.residual"):
        DriftConfig(residual="dense")
