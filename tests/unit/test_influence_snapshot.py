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
from d3ray.influence.snapshot import PackedState, load_snapshot, split_snapshot
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


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_packed_state_is_one_buffer_of_views_that_pickles_and_loads_like_the_dict(dtype):
    """What the trainers ship (``ship_state``): one flat buffer, every value a view in its parameter's shape,
    equal to the dict cast to ``dtype``; it survives pickling (what Ray does) and loads the same model."""
    import pickle

    weights = _weights(0)
    packed = PackedState.pack(weights, dtype)
    assert list(packed) == list(weights) and len(packed) == len(weights)
    flat_type = np.ndarray if dtype == "float32" else torch.Tensor
    assert isinstance(packed.flat, flat_type) and len(packed.flat) == sum(v.size for v in weights.values())
    for name, value in weights.items():
        expected = torch.from_numpy(value).to(getattr(torch, dtype))
        got = packed[name] if dtype == "bfloat16" else torch.from_numpy(packed[name])
        assert tuple(got.shape) == value.shape and torch.equal(got, expected)
    shipped = pickle.loads(pickle.dumps([packed, _adam(weights)], protocol=5))
    merged, optimizer = split_snapshot(shipped)
    model, reference = build_model(CONFIG, MODEL), build_model(CONFIG, MODEL)
    load_snapshot(model, merged)
    load_snapshot(reference, {k: torch.from_numpy(v).to(getattr(torch, dtype)) for k, v in weights.items()})
    assert optimizer is not None and all(torch.equal(a, b) for a, b in
                                         zip(model.state_dict().values(), reference.state_dict().values(), strict=True))


def test_packed_state_fill_converts_and_names_a_wrong_shape():
    packed = PackedState.empty({"a": (2,), "b": (1, 2)}, "float32")
    packed.fill("b", torch.tensor([[1.0, 2.0]], dtype=torch.bfloat16))
    np.testing.assert_array_equal(packed.flat, [0, 0, 1, 2])
    np.testing.assert_array_equal(packed["b"], [[1, 2]])
    with pytest.raises(ValueError, match=r"packed state 'a': shape \(3,\), expected \(2,\)"):
        packed.fill("a", np.zeros(3))
    with pytest.raises(ValueError, match="float32 or bfloat16, not 'float16'"):
        PackedState.empty({"a": (2,)}, "float16")
