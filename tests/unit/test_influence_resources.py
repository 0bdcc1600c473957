"""Influence and scoring actors use what they reserved (d3ray/influence/resources.py): the device from
their Ray resources, not from what the process can see; and the attention kernel from what the
estimator differentiates (d3ray/influence/worker.py). A background actor's lowered CPU priority
reaches every thread of its process."""

from __future__ import annotations

import os

import pytest
import torch
import transformers

from d3ray.influence.config import InfluenceConfig
from d3ray.influence.estimators import EstimatorConfig
from d3ray.influence.resources import cpu_priority, device_for_resources, lower_priority
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


def _lowered_priority(nice: int, idle: bool, queue) -> None:
    """In a child process (the change cannot be undone): lower, then report every thread's state."""
    import os
    import threading

    started, stop = threading.Event(), threading.Event()
    thread = threading.Thread(target=lambda: (started.set(), stop.wait()))  # a thread that exists before
    thread.start()
    started.wait()
    lower_priority(nice, idle)
    threads = [int(t) for t in os.listdir("/proc/self/task")]
    queue.put((cpu_priority(), sorted({os.getpriority(os.PRIO_PROCESS, t) for t in threads}),
               sorted({os.sched_getscheduler(t) for t in threads})))
    stop.set()


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux-only")
@pytest.mark.parametrize("idle", [False, True])
def test_lower_priority_reaches_every_thread(idle):
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_lowered_priority, args=(7, idle, queue))
    child.start()
    label, nices, policies = queue.get(timeout=60)
    child.join(timeout=60)
    assert nices == [7], "every thread, not just the caller, runs at the niceness"
    if idle:
        assert label == "idle" and policies == [os.SCHED_IDLE]
    else:
        assert label == "nice 7" and policies == [os.SCHED_OTHER]
