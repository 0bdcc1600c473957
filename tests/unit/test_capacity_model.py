"""The capacity model of ``d3ray bench influence-capacity`` on cases worked out by hand.

The hand architecture: GPT-2 with l = 1, h = 4, a = 2, f = 16, V = 10, T = 3, tied, B = 8 (n = 1 scored
sequence at s = 1/8). Its counts (capacity_arch docstring):
    N    = V·h + T·h + (4h² + 2hf + 9h + f) + 2h = 40 + 12 + (64 + 128 + 36 + 16) + 8 = 304
    N_mm = N − T·h = 292;   F = 6·292 + 12·1·4·3 = 1896 FLOPs per token
    activations per sequence: layers T·h·(34 + 5·a·T/h) = 12·41.5 = 498 (eager), 12·34 = 408 (flash);
    logits T·V·8 = 240
The hand device: peak 1e3 FLOP/s, MFU 0.5 (training) / 0.25 (influence), c_coord 1e-3 s, put 1e3 B/s,
get 2e3, host↔device 4e3, object 1e3, collectives 1e3 inside a node of 2 devices, 1e2 across, latency 0.01.
"""

from __future__ import annotations

import pytest

from d3ray.bench.capacity_arch import (
    ARCHITECTURES,
    Architecture,
    activation_bytes,
    architecture_of,
    matmul_params,
    param_count,
    train_flops_per_token,
)
from d3ray.bench.capacity_model import (
    DeviceConstants,
    InfluenceLoad,
    actor_memory_as_coded,
    actor_memory_floor,
    allreduce_sec,
    in_trainer_extra_memory,
    in_trainer_plan,
    in_trainer_wait_sec,
    influence_batch_sec,
    kvector_bytes,
    snapshot_bytes,
    snapshot_plan,
    snapshot_publish_sec,
    snapshot_score_sec,
    train_step_sec,
)

HAND = Architecture(name="hand", family="gpt2", layers=1, hidden=4, heads=2, kv_heads=2, ffn=16, vocab=10,
                    seq_len=3, tied_embeddings=True, batch_sequences=8, micro_batch=1, source="by hand")
DEV = DeviceConstants(
    name="hand", memory_bytes=1e6, peak_flops=1e3, mfu_train=0.5, mfu_influence=0.25, coordinate_sec=1e-3,
    put_bytes_per_sec=1e3, get_bytes_per_sec=2e3, host_device_bytes_per_sec=4e3, object_bytes_per_sec=1e3,
    intra_node_bytes_per_sec=1e3, inter_node_bytes_per_sec=1e2, devices_per_node=2, collective_latency_sec=0.01,
)
LOAD = InfluenceLoad(L=8, sample_fraction=0.125, k=10)


def test_capacity_arch_hand_case_counts_params_flops_and_activations():
    assert param_count(HAND) == 304
    assert matmul_params(HAND) == 292
    assert train_flops_per_token(HAND) == 1896
    assert activation_bytes(HAND, 2, eager_attention=True) == 2 * (498 + 240)
    assert activation_bytes(HAND, 1, eager_attention=False) == 408 + 240
    assert activation_bytes(HAND, 1, eager_attention=True, bytes_per_value=4) == 996 + 240


def test_capacity_arch_presets_match_published_parameter_counts():
    counts = {name: param_count(arch) for name, arch in ARCHITECTURES.items()}
    assert counts == {"gpt2-124m": 124_439_808, "llama-1b": 1_235_814_400, "llama-7b": 6_738_415_616,
                      "llama-70b": 70_553_706_496}


@pytest.mark.parametrize(("preset", "overrides"), [
    ("gpt2-tiny", {}),
    ("gpt2-small", {"n_inner": 320}),
    ("llama-tiny", {}),  # grouped KV heads below
    ("llama-tiny", {"num_key_value_heads": 1, "tie_word_embeddings": True}),
])
def test_capacity_arch_param_count_equals_transformers_model(preset, overrides):
    from d3ray.model import ModelConfig, build_model, model_config_dict

    cfg = ModelConfig(preset=preset, overrides=overrides)
    config = model_config_dict(cfg, vocab_size=97, seq_len=16, eos_id=0)
    model = build_model(config, cfg)
    arch = architecture_of(config, name=preset, batch_sequences=1, micro_batch=1, seq_len=16)
    assert param_count(arch) == sum(p.numel() for p in model.parameters())


def test_capacity_model_times_of_the_hand_case():
    assert train_step_sec(HAND, DEV, 1) == pytest.approx(1896 * 24 / 500)
    assert train_step_sec(HAND, DEV, 4) == pytest.approx(1896 * 24 / 2000)
    assert influence_batch_sec(HAND, LOAD, DEV) == pytest.approx(1896 * 3 / 250 + 0.304)
    assert allreduce_sec(1000, 1, DEV) == 0.0
    assert allreduce_sec(1000, 2, DEV) == pytest.approx(1.0 + 0.02)  # 2·½·1000/1e3 + 2·1·0.01
    assert allreduce_sec(1000, 4, DEV) == pytest.approx(15.0 + 0.04)  # across nodes: 2·¾·1000/1e2 + 2·2·0.01


def test_capacity_model_snapshot_bytes_and_publish_of_the_hand_case():
    assert snapshot_bytes(HAND, LOAD) == 6 * 304  # 16-bit weights, m and v
    assert snapshot_bytes(HAND, InfluenceLoad(adam=False)) == 2 * 304
    assert snapshot_publish_sec(HAND, LOAD, DEV, 1) == pytest.approx(1824 / 4e3 + 1824 / 1e3)
    assert snapshot_publish_sec(HAND, LOAD, DEV, 2) == pytest.approx(1824 / 2 / 1e3 + 1824 / 4e3 + 1824 / 1e3)
    fetch = 1824 / 1e3 + 1824 / 2e3 + 1824 / 4e3  # one node's pull, get, host→device
    batch = 1896 * 3 / 250 + 0.304
    assert snapshot_score_sec(HAND, LOAD, DEV, 2) == pytest.approx(fetch + 4 * batch)
    assert snapshot_score_sec(HAND, LOAD, DEV, 3) == pytest.approx(fetch + 1824 / 1e3 + 3 * batch)  # 2 nodes


def test_capacity_model_actor_memory_of_the_hand_case():
    floor = actor_memory_floor(HAND, LOAD)
    assert floor.parts == {"weights (16-bit)": 608, "gradient (fp32)": 1216, "activations": 648,
                           "m, v (16-bit)": 1216, "AdamW direction u (fp32)": 1216}
    assert floor.total == 4904
    coded = actor_memory_as_coded(HAND, LOAD)
    # work vectors: u, the stacked [g; u], the reference's two directions, the two running sums = 7
    assert coded.parts == {"weights (fp32)": 1216, "gradient (fp32)": 1216, "work vectors (fp32)": 7 * 1216,
                           "sjlt cache": 12 * 4 * 304, "activations": 1236, "m, v (fp32)": 2432}
    shard = in_trainer_extra_memory(HAND, LOAD, 4)
    assert shard.parts == {"gradient shards (fp32)": 304, "work vectors (fp32)": 7 * 304, "sjlt cache": 12 * 4 * 76}


def test_capacity_model_in_trainer_wait_of_the_hand_case():
    compute = 1896 * 3 / (2 * 1e3 * 0.25)  # one sequence per batch over 2 ranks
    gather = 6 * 304 / 2 / 1e3
    coords = 8 * 1e-3 * 304 / 2
    allreduce = 2 * 0.5 * kvector_bytes(LOAD) / 1e3 + 0.02
    assert kvector_bytes(LOAD) == 4 * 2 * 8 * 13
    assert in_trainer_wait_sec(HAND, LOAD, DEV, 2) == pytest.approx(8 * max(compute, gather) + coords + allreduce)
    # gathered once for all 8 batches: the traffic is paid once, against 8 batches of compute
    per_chunk = InfluenceLoad(L=8, sample_fraction=0.125, k=10, batches_per_gather=8)
    assert in_trainer_wait_sec(HAND, per_chunk, DEV, 2) == pytest.approx(max(8 * compute, gather) + coords + allreduce)


def test_capacity_model_in_trainer_plan_finds_the_largest_fraction_by_hand():
    # A device where only compute counts: wait(n) = L·n·F·T/(W·peak·mfu) = 8·n·1896·3/(1·1e3·1) = 45.504·n;
    # the chunk is 8·1896·24/1e3 = 364.032 s, 2% of it 7.28 s: none fits; 20%: 72.8 s → n = 1; 55%: 200.2 s → n = 4.
    free = DeviceConstants(
        name="compute only", memory_bytes=1e6, peak_flops=1e3, mfu_train=1.0, mfu_influence=1.0, coordinate_sec=0.0,
        put_bytes_per_sec=1e9, get_bytes_per_sec=1e9, host_device_bytes_per_sec=1e9, object_bytes_per_sec=1e9,
        intra_node_bytes_per_sec=1e9, inter_node_bytes_per_sec=1e9, devices_per_node=8, collective_latency_sec=0.0,
    )
    assert in_trainer_plan(HAND, LOAD, free, 1).max_sample_fraction is None
    assert in_trainer_plan(HAND, InfluenceLoad(k=10, wait_target=0.2), free, 1).max_sample_fraction == 1 / 8
    assert in_trainer_plan(HAND, InfluenceLoad(k=10, wait_target=0.55), free, 1).max_sample_fraction == 4 / 8


def test_capacity_model_snapshot_plan_picks_the_fewest_actors_and_refuses_what_does_not_fit():
    # Publishing is free and a batch costs 1/4 of a training step: one actor scores L batches in L/4 steps.
    free = DeviceConstants(
        name="free links", memory_bytes=1e6, peak_flops=1e3, mfu_train=1.0, mfu_influence=1.0, coordinate_sec=0.0,
        put_bytes_per_sec=1e12, get_bytes_per_sec=1e12, host_device_bytes_per_sec=1e12, object_bytes_per_sec=1e12,
        intra_node_bytes_per_sec=1e12, inter_node_bytes_per_sec=1e12, devices_per_node=8, collective_latency_sec=0.0,
    )
    wide = Architecture(**{**HAND.__dict__, "batch_sequences": 4, "micro_batch": 4})  # n = round(0.5) = 1 of 4
    plan = snapshot_plan(wide, InfluenceLoad(k=10), free, 1)
    assert plan.actors == 1 and plan.scoring_actors == 1
    assert plan.busy_fraction == pytest.approx(0.25, rel=1e-6)
    # Slower influence: a batch costs 2, 4, 8 steps, so ⌈8/G⌉ batches fit the 8-step chunk from G = 2, 4, 8;
    # at 16 steps a batch even 8 actors (one batch each) finish a chunk late.
    for mfu, actors in ((1 / 8, 2), (1 / 16, 4), (1 / 32, 8), (1 / 64, None)):
        plan = snapshot_plan(wide, InfluenceLoad(k=10), DeviceConstants(**{**free.__dict__, "mfu_influence": mfu}), 1)
        assert (plan.actors, plan.scoring_actors) == (actors, actors)
    assert "still finish late" in plan.reason
    tiny_gpu = DeviceConstants(**{**free.__dict__, "memory_bytes": 100.0})
    refused = snapshot_plan(wide, InfluenceLoad(k=10), tiny_gpu, 1)
    assert refused.actors is None and refused.scoring_actors is None and "GiB" in refused.reason
