"""The one snapshot reader (``d3ray/influence/snapshot.py``): strict for the influence and the scoring actors alike.

A snapshot with a key the model lacks, or without a tensor the model has, is an error naming the key, through
``load_snapshot`` and through both actors that read snapshots; a lenient reader (skip unknown keys, keep a
missing tensor as built) fails these tests.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from d3ray.influence.optimizer import AdamWState
from d3ray.influence.snapshot import load_snapshot, split_snapshot
from d3ray.model import ModelConfig, build_model, model_config_dict

MODEL = ModelConfig()
CONFIG = model_config_dict(MODEL, 64, 8, 0)
MISSING = "transformer.h.0.mlp.c_fc.weight"
UNKNOWN = "transformer.h.9.attn.c_attn.weight"


def _weights(seed: int) -> dict[str, np.ndarray]:
    torch.manual_seed(seed)
    return {k: v.detach().numpy().copy() for k, v in build_model(CONFIG, MODEL).state_dict().items()}


def _adam(weights: dict[str, np.ndarray]) -> AdamWState:
    return AdamWState(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, step=1,
                      exp_avg={n: np.zeros_like(v) for n, v in weights.items()},
                      exp_avg_sq={n: np.ones_like(v) for n, v in weights.items()})


def test_load_snapshot_copies_every_tensor_through_a_module_prefix_and_a_tied_name():
    source, model = _weights(1), build_model(CONFIG, MODEL)
    prefixed = {f"module.{k}": v for k, v in source.items() if k != "lm_head.weight"}  # tied to wte
    load_snapshot(model, prefixed)
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), source[name], err_msg=name)


def test_load_snapshot_unknown_key_raises_naming_it():
    model = build_model(CONFIG, MODEL)
    weights = _weights(1)
    with pytest.raises(ValueError, match=UNKNOWN.replace(".", r"\.")):
        load_snapshot(model, {**weights, UNKNOWN: weights[MISSING]})


def test_load_snapshot_missing_key_raises_naming_it():
    model = build_model(CONFIG, MODEL)
    with pytest.raises(ValueError, match=f"lack '{MISSING}'"):
        load_snapshot(model, {k: v for k, v in _weights(1).items() if k != MISSING})


def test_load_snapshot_other_shape_raises_naming_the_key():
    model = build_model(CONFIG, MODEL)
    weights = _weights(1)
    with pytest.raises(ValueError, match=MISSING.replace(".", r"\.") + ".*shape"):
        load_snapshot(model, {**weights, MISSING: weights[MISSING][:, :1]})


def test_split_snapshot_separates_the_optimizer_state_and_refuses_two():
    weights = _weights(1)
    first, second = dict(list(weights.items())[:3]), dict(list(weights.items())[3:])
    adam = _adam(weights)
    merged, optimizer = split_snapshot([first, adam, second])
    assert merged.keys() == weights.keys() and optimizer is adam
    with pytest.raises(ValueError, match="two optimizer states"):
        split_snapshot([weights, adam, adam])


def test_scoring_worker_reads_snapshots_strictly():
    from d3ray.schedule.scoring import ScoringWorker

    worker = ScoringWorker(CONFIG, MODEL)
    weights = _weights(1)
    batch = np.random.default_rng(0).integers(1, 64, size=(2, 8))
    with pytest.raises(ValueError, match=UNKNOWN.replace(".", r"\.")):
        worker.losses([{**weights, UNKNOWN: weights[MISSING]}], [batch])
    with pytest.raises(ValueError, match=f"lack '{MISSING}'"):
        worker.losses([{k: v for k, v in weights.items() if k != MISSING}], [batch])
    adam = _adam(weights)
    worker.losses([weights, adam], [batch])
    assert worker.optimizer_state is adam
    np.testing.assert_array_equal(worker.model.state_dict()[MISSING].numpy(), weights[MISSING])


def test_influence_worker_reads_snapshots_strictly():
    from d3ray.influence.config import InfluenceConfig
    from d3ray.influence.worker import InfluenceWorker

    worker = InfluenceWorker(CONFIG, InfluenceConfig(device="cpu"))
    weights = _weights(1)
    with pytest.raises(ValueError, match=UNKNOWN.replace(".", r"\.")):
        worker.load_weights({**weights, UNKNOWN: weights[MISSING]})
    with pytest.raises(ValueError, match=f"lack '{MISSING}'"):
        worker.load_weights({k: v for k, v in weights.items() if k != MISSING})
