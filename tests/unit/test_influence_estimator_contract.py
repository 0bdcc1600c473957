"""One contract for every registered estimator, with the plain step and the AdamW step.

Each (estimator, preconditioner) on a tiny float64 GPT-2 must give a finite S that is antisymmetric to
the last bit, the same S for the same seed from a fresh worker, and the same S whatever the split of
the chunk across workers (batches for the Taylor estimators, rows for the exact look-ahead).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import transformers

from d3ray.influence import AdamWState, EstimatorConfig, InfluenceConfig, SjltSketchConfig, mean_reference
from d3ray.influence.worker import InfluenceWorker

MODEL = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=16).to_dict()
IDS = [20, 21, 22, 23, 24]


def _batches(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 64, size=(3, 12)) for _ in range(n)]


@pytest.fixture(scope="module")
def snapshot():
    """Weights of a fresh model and a non-trivial AdamW state for them (as a trainer would publish)."""
    worker = InfluenceWorker(MODEL, InfluenceConfig(dtype="float64", device="cpu"))
    weights = {k: v.detach().float().numpy() for k, v in worker.model.state_dict().items()}
    rng = np.random.default_rng(3)
    shapes = {n: tuple(p.shape) for n, p in worker.model.named_parameters()}
    state = AdamWState(
        lr=2e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, step=12,
        exp_avg={n: (rng.normal(size=s) * 1e-2).astype(np.float32) for n, s in shapes.items()},
        exp_avg_sq={n: (rng.random(size=s) * 1e-4).astype(np.float32) for n, s in shapes.items()},
    )
    return [weights, state]


@pytest.mark.parametrize("preconditioner", ["none", "adam"])
@pytest.mark.parametrize("name", EstimatorConfig.known())
def test_estimator_contract_finite_antisymmetric_deterministic_split_invariant(name, preconditioner, snapshot):
    config = InfluenceConfig(
        estimator=EstimatorConfig.lookup(name)(), preconditioner=preconditioner, gamma=0.05,
        sketch=SjltSketchConfig(k=40, seed=1), sample_fraction=0.67, seed=9, dtype="float64", device="cpu",
    )
    chunk = _batches(len(IDS), seed=4)

    def whole(worker: InfluenceWorker, reference=None) -> np.ndarray:
        if config.estimator.is_exact_lookahead:
            return config.estimator.merge([worker.lookahead_matrix(snapshot, chunk, IDS)], IDS)[1]
        part = worker.sketch_batches(snapshot, chunk, IDS, reference=reference)
        return config.estimator.merge([part], IDS)[1]

    first, second = InfluenceWorker(MODEL, config), InfluenceWorker(MODEL, config)
    if config.estimator.is_exact_lookahead:
        reference = None
        split = [
            first.lookahead_matrix(snapshot, chunk, IDS, rows=IDS[3:]),
            second.lookahead_matrix(snapshot, chunk, IDS, rows=IDS[:3]),
        ]
    else:  # several workers share a chunk with a common reference (the previous chunk's mean)
        previous = first.sketch_batches(snapshot, _batches(3, seed=5), [1, 2, 3], return_means=True)
        reference = mean_reference([previous.means])
        split = [
            first.sketch_batches(snapshot, chunk[:2], IDS[:2], reference=reference),
            second.sketch_batches(snapshot, chunk[2:], IDS[2:], reference=reference),
        ]
    S = whole(first, reference)
    S_split = config.estimator.merge(split, IDS)[1]

    assert np.all(np.isfinite(S))
    assert np.array_equal(S, -S.T)
    assert np.array_equal(whole(second, reference), S)
    np.testing.assert_allclose(S_split, S, rtol=1e-12, atol=1e-15 * np.abs(S).max())
    expects_zero = not config.estimator.has_curvature and preconditioner == "none"
    assert np.all(S == 0) if expects_zero else np.any(S != 0)


@pytest.mark.parametrize("name", EstimatorConfig.known())
def test_estimator_contract_other_seed_changes_only_random_estimators(name, snapshot):
    config = InfluenceConfig(
        estimator=EstimatorConfig.lookup(name)(), preconditioner="adam", sketch=SjltSketchConfig(k=40),
        sample_fraction=1.0, dtype="float64", device="cpu",  # a fraction < 1 draws its rows with the seed too
    )
    chunk = _batches(3, seed=6)

    def S(cfg: InfluenceConfig) -> np.ndarray:
        worker = InfluenceWorker(MODEL, cfg)
        if cfg.estimator.is_exact_lookahead:
            return cfg.estimator.merge([worker.lookahead_matrix(snapshot, chunk, IDS[:3])], IDS[:3])[1]
        return cfg.estimator.merge([worker.sketch_batches(snapshot, chunk, IDS[:3])], IDS[:3])[1]

    # seed draws Hutchinson probes and GNB labels; the other estimators are deterministic functions of θ.
    random_draws = name in ("hutchinson", "gnb")
    assert np.array_equal(S(config), S(replace(config, seed=1))) != random_draws
