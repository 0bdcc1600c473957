"""Influence and scoring actors use what they reserved (d3ray/influence/resources.py): the device from
their Ray resources, not from what the process can see; and the attention kernel from what the
estimator differentiates (d3ray/influence/worker.py)."""

from __future__ import annotations

import pytest
import torch
import transformers

from d3ray.influence.config import InfluenceConfig
from d3ray.influence.estimators import EstimatorConfig
from d3ray.influence.resources import device_for_resources
from d3ray.influence.worker import InfluenceWorker, influence_attention

MODEL = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=16).to_dict()


@pytest.mark.parametrize(
    ("setting", "resources", "cuda", "expected"),
    [
        ("auto", {"CPU": 1.0}, True, "cpu"),  # reserved no GPU: not cuda:0, though the node has one
        ("auto", {"CPU": 1.0, "GPU": 0.0}, True, "cpu"),
        ("auto", {"CPU": 1.0, "GPU": 0.5}, True, "cuda:0"),  # its share: Ray makes only its GPU visible
        ("auto", {"CPU": 1.0, "GPU": 1.0}, False, "cpu"),  # a fake GPU resource (tests), no device
        ("auto", None, True, "cuda"),  # not a Ray actor (a benchmark, a test): what the process has
        ("auto", None, False, "cpu"),
        ("cpu", {"GPU": 1.0}, True, "cpu"),  # an explicit device is taken as given
        ("cuda:1", None, True, "cuda:1"),
    ],
)
def test_device_for_resources_auto_follows_the_reservation(setting, resources, cuda, expected):
    assert device_for_resources(setting, resources, cuda) == torch.device(expected)


@pytest.mark.parametrize(
    ("requested", "estimator", "expected"),
    [
        ("sdpa", "first_order", "sdpa"),
        ("sdpa", "fisher", "sdpa"),
        ("flash_attention_2", "gnb", "sdpa"),  # 16-bit only: the fp32 influence model takes SDPA
        ("sdpa", "hutchinson", "eager"),  # double backward
        ("eager", "first_order", "eager"),
    ],
)
def test_influence_attention_only_double_backward_forces_eager(requested, estimator, expected):
    double = EstimatorConfig.lookup(estimator)().needs_double_backward
    assert influence_attention(requested, double) == expected


def test_influence_worker_first_order_builds_the_trainers_sdpa_model():
    config = InfluenceConfig(estimator=EstimatorConfig.lookup("first_order")(), device="auto")
    worker = InfluenceWorker(MODEL, config, attn_implementation="sdpa")
    assert worker.model.config._attn_implementation == "sdpa"
    assert worker.device == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    hutchinson = InfluenceWorker(MODEL, InfluenceConfig(estimator=EstimatorConfig.lookup("hutchinson")()),
                                 attn_implementation="sdpa")
    assert hutchinson.model.config._attn_implementation == "eager"
