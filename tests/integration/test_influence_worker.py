"""InfluenceWorker as Ray actors: weights and batches by reference, a chunk split across two actors."""

from __future__ import annotations

import numpy as np
import pytest
import transformers

from d3ray.influence.config import InfluenceConfig, SjltSketchConfig
from d3ray.influence.estimators import HutchinsonConfig
from d3ray.influence.influence import influence_from_lookahead, influence_from_sketches, mean_reference
from d3ray.influence.worker import InfluenceWorker

pytestmark = pytest.mark.ray

MODEL = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=16).to_dict()
CONFIG = InfluenceConfig(
    estimator=HutchinsonConfig(),
    sketch=SjltSketchConfig(k=48, seed=5),
    control_variate=True,
    dtype="float64",
    device="cpu",
    gamma=0.05,
    preconditioner="none",
    sample_fraction=1.0,
)
GAMMA = CONFIG.gamma


def _batches(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 64, size=(3, 12)) for _ in range(n)]


def test_influence_actors_split_chunk_match_one_local_worker(ray_cluster):
    ray = ray_cluster
    local = InfluenceWorker(MODEL, CONFIG)
    weights = {k: v.detach().float().numpy() for k, v in local.model.state_dict().items()}
    previous = local.sketch_batches(weights, _batches(3, seed=1), [90, 91, 92], return_means=True)
    reference = mean_reference([previous.means])
    chunk, ids = _batches(4, seed=2), [10, 11, 12, 13]
    expected_A, expected_S, _ = influence_from_sketches(
        [local.sketch_batches(weights, chunk, ids, reference=reference)], ids
    )

    actors = [ray.remote(InfluenceWorker).options(num_cpus=0.5).remote(MODEL, CONFIG) for _ in range(2)]
    weights_ref, reference_ref = ray.put(weights), ray.put(reference)
    batch_refs = [ray.put(b) for b in chunk]
    parts = ray.get(
        [
            actors[0].sketch_batches.remote(
                [weights_ref], batch_refs[:2], ids[:2], reference=[reference_ref]
            ),
            actors[1].sketch_batches.remote(
                [weights_ref], batch_refs[2:], ids[2:], reference=[reference_ref]
            ),
        ]
    )
    A, S, excluded = influence_from_sketches(parts, ids)

    assert excluded == []
    assert parts[0].sketch_id == parts[1].sketch_id
    np.testing.assert_allclose(A, expected_A, rtol=1e-12, atol=1e-18)
    np.testing.assert_allclose(S, expected_S, rtol=1e-12, atol=1e-18)
    assert np.any(S != 0)

    rows = ray.get(
        [
            actors[0].lookahead_matrix.remote([weights_ref], batch_refs, ids, GAMMA, [10, 12]),
            actors[1].lookahead_matrix.remote([weights_ref], batch_refs, ids, GAMMA, [11, 13]),
        ]
    )
    A_look, S_look, _ = influence_from_lookahead(rows, ids)
    A_local, _, _ = influence_from_lookahead([local.lookahead_matrix(weights, chunk, ids, GAMMA)], ids)
    np.testing.assert_allclose(A_look, A_local, rtol=1e-12, atol=1e-18)
    np.testing.assert_array_equal(S_look, -S_look.T)
