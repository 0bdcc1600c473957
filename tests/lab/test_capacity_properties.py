"""Monotonicity of the capacity model, the default estimator against the sketched ones, and its two
searches against brute force (Hypothesis)."""

from __future__ import annotations

import math
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from d3ray.lab.bench.capacity_arch import Architecture, activation_bytes, param_count
from d3ray.lab.bench.capacity_in_trainer import (
    in_trainer_extra_memory,
    in_trainer_plan,
    in_trainer_wait_sec,
)
from d3ray.lab.bench.capacity_model import (
    ESTIMATORS,
    DeviceConstants,
    InfluenceLoad,
    batch_coordinate_bytes,
    scored_sequences,
    train_step_sec,
)
from d3ray.lab.bench.capacity_snapshot import (
    actor_memory_as_coded,
    actor_memory_floor,
    chunk_cost,
    snapshot_bytes,
    snapshot_plan,
    snapshot_wait_sec,
)

SETTINGS = settings(max_examples=40, deadline=None)


@st.composite
def architectures(draw) -> Architecture:
    family = draw(st.sampled_from(["gpt2", "llama"]))
    kv = draw(st.integers(1, 4))
    heads = kv * draw(st.integers(1, 4))
    return Architecture(
        name="drawn", family=family, layers=draw(st.integers(1, 8)), hidden=heads * draw(st.integers(1, 64)),
        heads=heads, kv_heads=kv if family == "llama" else heads, ffn=draw(st.integers(1, 512)),
        vocab=draw(st.integers(2, 5000)), seq_len=draw(st.integers(2, 512)),
        tied_embeddings=draw(st.booleans()), batch_sequences=draw(st.integers(1, 64)),
        micro_batch=draw(st.integers(1, 8)), source="hypothesis",
    )


rates = st.floats(1e3, 1e12)
devices = st.builds(
    DeviceConstants, name=st.just("drawn"), memory_bytes=st.floats(1e3, 1e15), peak_flops=rates,
    mfu_train=st.floats(0.05, 1.0), mfu_influence=st.floats(0.05, 1.0),
    mfu_in_trainer=st.none() | st.floats(0.05, 1.0), memory_bytes_per_sec=rates,
    put_bytes_per_sec=rates, get_bytes_per_sec=rates, host_device_bytes_per_sec=rates, object_bytes_per_sec=rates,
    intra_node_bytes_per_sec=rates, inter_node_bytes_per_sec=rates, devices_per_node=st.integers(1, 8),
    collective_latency_sec=st.floats(0, 1e-3),
)
loads = st.builds(
    InfluenceLoad, estimator=st.sampled_from(ESTIMATORS), L=st.integers(1, 16), sample_fraction=st.floats(0.01, 1.0),
    k=st.integers(1, 4000), wait_target=st.floats(0.001, 0.5), snapshot_bytes_per_value=st.sampled_from([2, 4]),
    sjlt_cache_bytes=st.floats(0, 2.0**20), control_variate=st.booleans(),
)


@SETTINGS
@given(arch=architectures(), more=st.integers(1, 4))
def test_capacity_param_count_grows_with_depth_width_and_vocabulary(arch, more):
    assert param_count(replace(arch, layers=arch.layers + more)) > param_count(arch)
    assert param_count(replace(arch, vocab=arch.vocab + more)) > param_count(arch)
    assert param_count(replace(arch, ffn=arch.ffn + more)) > param_count(arch)
    assert activation_bytes(arch, 2, eager_attention=True) >= activation_bytes(arch, 2, eager_attention=False)


@SETTINGS
@given(arch=architectures(), dev=devices, ranks=st.integers(1, 64), more=st.integers(1, 64))
def test_capacity_train_step_shrinks_with_more_ranks(arch, dev, ranks, more):
    assert train_step_sec(arch, dev, ranks + more) < train_step_sec(arch, dev, ranks)


@SETTINGS
@given(arch=architectures(), dev=devices, load=loads, ranks=st.integers(1, 32), a=st.integers(1, 64),
       b=st.integers(1, 64))
def test_capacity_in_trainer_wait_grows_with_scored_sequences(arch, dev, load, ranks, a, b):
    lo, hi = sorted((a, b))
    assert in_trainer_wait_sec(arch, load, dev, ranks, lo) <= in_trainer_wait_sec(arch, load, dev, ranks, hi)


@SETTINGS
@given(arch=architectures(), dev=devices, load=loads, ranks=st.integers(1, 32), f=st.floats(0.01, 1.0))
def test_capacity_snapshot_wait_and_memory_grow_with_sample_fraction(arch, dev, load, ranks, f):
    lo, hi = sorted((f, load.sample_fraction))
    small, large = replace(load, sample_fraction=lo), replace(load, sample_fraction=hi)
    for actors in (1, load.L):
        assert snapshot_wait_sec(arch, small, dev, ranks, actors) <= snapshot_wait_sec(arch, large, dev, ranks, actors)
    assert actor_memory_floor(arch, small).total <= actor_memory_floor(arch, large).total


@SETTINGS
@given(arch=architectures(), load=loads, ranks=st.integers(1, 64), more=st.integers(1, 64))
def test_capacity_in_trainer_extra_memory_shrinks_with_more_ranks(arch, load, ranks, more):
    assert in_trainer_extra_memory(arch, load, ranks + more).total <= in_trainer_extra_memory(arch, load, ranks).total


@SETTINGS
@given(arch=architectures(), dev=devices, load=loads, ranks=st.integers(1, 32))
def test_capacity_in_trainer_plan_is_the_largest_fraction_within_the_target(arch, dev, load, ranks):
    plan = in_trainer_plan(arch, load, dev, ranks)
    budget = load.wait_target * plan.chunk_train_sec
    fits = [n for n in range(1, arch.batch_sequences + 1) if in_trainer_wait_sec(arch, load, dev, ranks, n) <= budget]
    expected = max(fits) / arch.batch_sequences if fits else None
    assert plan.max_sample_fraction == expected
    at_default = in_trainer_wait_sec(arch, load, dev, ranks)
    assert math.isclose(plan.wait_sec, at_default)
    if plan.max_sample_fraction is not None:
        # the configured s fits exactly when it scores no more sequences than the largest fitting n
        fitting = scored_sequences(arch.batch_sequences, load.sample_fraction) <= max(fits)
        assert (plan.wait_sec <= budget) == fitting


@SETTINGS
@given(arch=architectures(), dev=devices, load=loads, ranks=st.integers(1, 32), tighter=st.floats(0.1, 1.0))
def test_capacity_plans_never_loosen_with_a_tighter_target(arch, dev, load, ranks, tighter):
    strict = replace(load, wait_target=load.wait_target * tighter)
    loose_s, strict_s = (in_trainer_plan(arch, x, dev, ranks).max_sample_fraction for x in (load, strict))
    assert strict_s is None or (loose_s is not None and strict_s <= loose_s)
    loose_g, strict_g = (snapshot_plan(arch, x, dev, ranks).actors for x in (load, strict))
    assert strict_g is None or (loose_g is not None and strict_g >= loose_g)


@SETTINGS
@given(arch=architectures(), dev=devices, load=loads, ranks=st.integers(1, 32))
def test_capacity_snapshot_plan_is_the_fewest_actors_within_the_target(arch, dev, load, ranks):
    plan = snapshot_plan(arch, load, dev, ranks)
    budget = load.wait_target * plan.chunk_train_sec
    fits = [G for G in range(1, load.L + 1) if snapshot_wait_sec(arch, load, dev, ranks, G) <= budget]
    if plan.memory_floor.total > dev.memory_bytes:
        assert plan.actors is None
    else:
        assert plan.actors == (min(fits) if fits else None)


@SETTINGS
@given(arch=architectures(), dev=devices, load=loads, ranks=st.integers(1, 64), more=st.integers(1, 4))
def test_capacity_chunk_cost_grows_with_the_model(arch, dev, load, ranks, more):
    """More layers or a wider MLP: every phase of the actor's chunk costs at least as much, and so does the
    snapshot and its publish."""
    for bigger in (replace(arch, layers=arch.layers + more), replace(arch, ffn=arch.ffn + more)):
        small, large = chunk_cost(arch, load, dev, ranks), chunk_cost(bigger, load, dev, ranks)
        for name in ("transfer_sec", "host_to_device_sec", "drift_sec", "fwd_bwd_sec", "coordinate_sec",
                     "actor_sec", "publish_sec", "step_sec"):
            assert getattr(large, name) >= getattr(small, name) * (1 - 1e-12), name
        assert snapshot_bytes(bigger, load) > snapshot_bytes(arch, load)


@SETTINGS
@given(arch=architectures(), dev=devices, load=loads, ranks=st.integers(1, 64))
def test_capacity_default_estimator_is_never_dearer_than_a_sketched_one(arch, dev, load, ranks):
    """drift with residual none (a dot product per batch, w per chunk) costs no more time or bytes than
    first_order or drift with a sketched residual under the same knobs, nor more memory when the sketch has
    its control variate (the code's default; without it the sketch holds 3 vectors, 12N, and the drift's
    4N w + float64 casts of a tensor can exceed that on a model that is one large tensor)."""
    drift = replace(load, estimator="drift")
    N = param_count(arch)
    for other in ("first_order", "drift_sketch"):
        sketched = replace(load, estimator=other)
        assert batch_coordinate_bytes(drift, N) < batch_coordinate_bytes(sketched, N)
        assert chunk_cost(arch, drift, dev, ranks).actor_sec <= chunk_cost(arch, sketched, dev, ranks).actor_sec
        if load.control_variate:
            assert actor_memory_as_coded(arch, drift).total <= actor_memory_as_coded(arch, sketched).total
        assert in_trainer_wait_sec(arch, drift, dev, ranks) <= in_trainer_wait_sec(arch, sketched, dev, ranks)


@SETTINGS
@given(load=loads, a=st.integers(1, 10**11), b=st.integers(1, 10**11))
def test_capacity_sketched_bytes_grow_with_the_hashed_share(load, a, b):
    """Beyond the index cache every coordinate is hashed again: bytes per coordinate are non-decreasing in N,
    between the all-cached and the all-hashed counts."""
    lo, hi = sorted((a, b))
    assert batch_coordinate_bytes(load, lo) <= batch_coordinate_bytes(load, hi)
    cached = batch_coordinate_bytes(replace(load, sjlt_cache_bytes=1e30), hi)
    hashed = batch_coordinate_bytes(replace(load, sjlt_cache_bytes=0.0), hi)
    assert cached <= batch_coordinate_bytes(load, hi) <= hashed
    assert (cached == hashed) == (not load.sketches)


@SETTINGS
@given(arch=architectures(), dev=devices, load=loads, ranks=st.integers(1, 64), more=st.integers(1, 16))
def test_capacity_actor_chunk_grows_with_L_and_float32_snapshots(arch, dev, load, ranks, more):
    longer = replace(load, L=load.L + more)
    assert chunk_cost(arch, longer, dev, ranks).actor_sec > chunk_cost(arch, load, dev, ranks).actor_sec
    fp32 = replace(load, snapshot_bytes_per_value=4)
    assert snapshot_bytes(arch, fp32) >= snapshot_bytes(arch, load)
    assert chunk_cost(arch, fp32, dev, ranks).transfer_sec >= chunk_cost(arch, load, dev, ranks).transfer_sec
