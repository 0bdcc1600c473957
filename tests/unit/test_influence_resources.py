"""Influence and scoring actors use what they reserved (d3ray/influence/resources.py): the device from
their Ray resources, not from what the process can see; and the attention kernel from what the
estimator differentiates (d3ray/influence/worker.py). A background actor's lowered CPU priority
reaches the thread that runs its tasks and the threads that
thread starts, not Ray's own threads."""

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


def _lowered_priority(idle: bool, queue) -> None:
    """In a child process (the change cannot be undone): a thread started before, the caller, and a
    thread started after :func:`lower_priority`, each reporting (niceness, policy) from inside."""
    import os
    import queue as queue_module
    import threading

    def state() -> tuple[int, int]:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id()), os.sched_getscheduler(0)

    base = os.nice(0)
    nice = min(base + 5, 19)
    before_q: queue_module.Queue = queue_module.Queue()
    go = threading.Event()
    before = threading.Thread(target=lambda: (go.wait(), before_q.put(state())))
    before.start()
    lower_priority(nice, idle)
    caller = state()
    after_q: queue_module.Queue = queue_module.Queue()
    after = threading.Thread(target=lambda: after_q.put(state()))
    after.start()
    go.set()
    queue.put((base, nice, cpu_priority(), before_q.get(timeout=30), caller, after_q.get(timeout=30)))


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux-only")
@pytest.mark.parametrize("idle", [False, True])
def test_lower_priority_reaches_the_caller_and_threads_it_starts_not_rays_own(idle):
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_lowered_priority, args=(idle, queue))
    child.start()
    base, nice, label, before, caller, after = queue.get(timeout=60)
    child.join(timeout=60)
    if nice == base:
        pytest.skip(f"this process already runs at niceness {base}: nothing to lower")
    policy = os.SCHED_IDLE if idle else os.SCHED_OTHER
    assert caller == (nice, policy) and after == (nice, policy), "the task thread and the pool it starts are lowered"
    assert before == (base, os.SCHED_OTHER), "a thread that existed before (Ray's gRPC threads) keeps its priority"
    assert label == ("idle" if idle else f"nice {nice}")
