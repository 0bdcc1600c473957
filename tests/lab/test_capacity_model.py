"""The capacity model of ``d3ray bench influence-capacity`` on cases worked out by hand.

The hand architecture: GPT-2 with l = 1, h = 4, a = 2, f = 16, V = 10, T = 3, tied, B = 8 (n = 1 scored
sequence at s = 1/8). Its counts (capacity_arch docstring):
    N    = V·h + T·h + (4h² + 2hf + 9h + f) + 2h = 40 + 12 + (64 + 128 + 36 + 16) + 8 = 304
    N_mm = N − T·h = 292;   F = 6·292 + 12·1·4·3 = 1896 FLOPs per token
    tied copy in the state dict V·h = 40; largest tensor max(V·h 40, h·f 64, 3h² 48, T·h 12) = 64
    activations per sequence: layers T·h·(34 + 5·a·T/h) = 12·41.5 = 498 (eager), 12·34 = 408 (flash);
    logits T·V·8 = 240
The hand device: peak 1e3 FLOP/s, MFU 0.5 (training) / 0.25 (influence), memory 2e3 B/s, put 1e3 B/s,
get 2e3, host↔device 4e3, object 1e3, collectives 1e3 inside a node of 2 devices, 1e2 across, latency 0.01.
The default load is the default estimator: drift with residual none (40 bytes a coordinate per batch, the
potential's float64 dot; 80 once per chunk, the drift w), adam, bfloat16 snapshots, L = 8.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from d3ray.lab.bench.capacity_arch import (
    ARCHITECTURES,
    Architecture,
    activation_bytes,
    architecture_of,
    largest_tensor,
    matmul_params,
    param_count,
    tied_copy,
    train_flops_per_token,
)
from d3ray.lab.bench.capacity_in_trainer import (
    in_trainer_extra_memory,
    in_trainer_plan,
    in_trainer_wait_sec,
    kvector_bytes,
)
from d3ray.lab.bench.capacity_model import (
    DeviceConstants,
    InfluenceLoad,
    Memory,
    allreduce_sec,
    batch_coordinate_bytes,
    chunk_coordinate_bytes,
    influence_batch_sec,
    train_step_sec,
)
from d3ray.lab.bench.capacity_snapshot import (
    actor_memory_as_coded,
    actor_memory_floor,
    chunk_cost,
    host_to_device_bytes,
    publish_device_to_host_bytes,
    snapshot_bytes,
    snapshot_fetch_sec,
    snapshot_plan,
    snapshot_publish_sec,
    snapshot_score_sec,
)

HAND = Architecture(name="hand", family="gpt2", layers=1, hidden=4, heads=2, kv_heads=2, ffn=16, vocab=10,
                    seq_len=3, tied_embeddings=True, batch_sequences=8, micro_batch=1, source="by hand")
DEV = DeviceConstants(
    name="hand", memory_bytes=1e6, peak_flops=1e3, mfu_train=0.5, mfu_influence=0.25, memory_bytes_per_sec=2e3,
    put_bytes_per_sec=1e3, get_bytes_per_sec=2e3, host_device_bytes_per_sec=4e3, object_bytes_per_sec=1e3,
    intra_node_bytes_per_sec=1e3, inter_node_bytes_per_sec=1e2, devices_per_node=2, collective_latency_sec=0.01,
)
LOAD = InfluenceLoad(L=8, sample_fraction=0.125, potential_method="gradient")  # drift, residual none, f from g
STEP = InfluenceLoad(L=8, sample_fraction=0.125)  # the default: the same, f from two batched forwards
SKETCHED = InfluenceLoad(estimator="first_order", L=8, sample_fraction=0.125, k=10)


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
    # what the trainers ship: the state dict's parameters, a tied lm_head as a second key of its own
    named = {n for n, _ in model.named_parameters()} | {"lm_head.weight"}
    shipped = sum(t.numel() for n, t in model.state_dict().items() if n in named)
    assert shipped == param_count(arch) + tied_copy(arch)
    assert max(p.numel() for p in model.parameters()) == largest_tensor(arch)


def test_capacity_arch_hand_case_tied_copy_and_largest_tensor():
    assert tied_copy(HAND) == 40 and largest_tensor(HAND) == 64
    assert tied_copy(ARCHITECTURES["llama-7b"]) == 0  # untied: lm_head is a parameter of its own (in N)
    assert largest_tensor(ARCHITECTURES["llama-7b"]) == 32000 * 4096  # the embedding, above h·f = 45M


def test_capacity_model_coordinate_bytes_are_the_codes_by_hand():
    # drift, residual none: g and w cast to float64 (4 + 8 each), the dot reads 16 = 40; w once a chunk 80
    assert batch_coordinate_bytes(LOAD, 304) == 40
    assert chunk_coordinate_bytes(LOAD) == 80 and chunk_coordinate_bytes(LOAD, in_trainer=True) == 96
    # first_order + adam, S = 2, σ = 4, indices cached: u 176 + stack 16 + projection (8 + 48 + 64) 120
    # + control variate 5 dots 80 + running sums 24 = 416
    assert batch_coordinate_bytes(SKETCHED, 304) == 416
    assert batch_coordinate_bytes(replace(SKETCHED, control_variate=False), 304) == 176 + 16 + 120
    # nothing cached: every coordinate hashed, 24 + 390·4 = 1584 more
    assert batch_coordinate_bytes(replace(SKETCHED, sjlt_cache_bytes=0), 304) == 416 + 1584
    # a cache of 152 coordinates (48 bytes each): half of them hashed
    assert batch_coordinate_bytes(replace(SKETCHED, sjlt_cache_bytes=152 * 48), 304) == 416 + 792
    # drift with the sketched residual: potential 40 + u 176 + s = u − w 12 + 16 + 120 + 80 + 24 = 468
    assert batch_coordinate_bytes(replace(SKETCHED, estimator="drift_sketch"), 304) == 468
    assert chunk_coordinate_bytes(SKETCHED) == 0


def test_capacity_model_times_of_the_hand_case():
    assert train_step_sec(HAND, DEV, 1) == pytest.approx(1896 * 24 / 500)
    assert train_step_sec(HAND, DEV, 4) == pytest.approx(1896 * 24 / 2000)
    # forward+backward of n = 1: 1896·3/(1e3·0.25) = 22.752; the potential 40·304/2e3 = 6.08
    assert influence_batch_sec(HAND, LOAD, DEV) == pytest.approx(22.752 + 6.08)
    assert influence_batch_sec(HAND, SKETCHED, DEV) == pytest.approx(22.752 + 416 * 304 / 2e3)
    assert allreduce_sec(1000, 1, DEV) == 0.0
    assert allreduce_sec(1000, 2, DEV) == pytest.approx(1.0 + 0.02)  # 2·½·1000/1e3 + 2·1·0.01
    assert allreduce_sec(1000, 4, DEV) == pytest.approx(15.0 + 0.04)  # across nodes: 2·¾·1000/1e2 + 2·2·0.01


def test_capacity_model_step_potential_of_the_hand_case():
    """``potential: step``: two forwards (2/3 of the forward+backward), no O(N) work per batch, θ − η·w once."""
    assert batch_coordinate_bytes(STEP, 304) == 0
    assert chunk_coordinate_bytes(STEP) == 80 + 12 and chunk_coordinate_bytes(STEP, in_trainer=True) == 96
    assert influence_batch_sec(HAND, STEP, DEV) == pytest.approx(22.752 * 2 / 3)  # 15.168
    c = chunk_cost(HAND, STEP, DEV, 1)
    assert (c.fwd_bwd_sec, c.coordinate_sec, c.batch_sec) == pytest.approx((15.168, 0.0, 15.168))
    assert c.drift_sec == pytest.approx(92 * 304 / 2e3)  # 13.984
    assert c.actor_sec == pytest.approx(c.transfer_sec + c.host_to_device_sec + 13.984 + 8 * 15.168)
    # the trainers score on ZeRO-3 slices with the gradient whatever the actors' method
    assert in_trainer_wait_sec(HAND, STEP, DEV, 2) == pytest.approx(in_trainer_wait_sec(HAND, LOAD, DEV, 2))
    # the sketched estimators and drift with the sketched residual need g: the method changes nothing there
    assert batch_coordinate_bytes(replace(SKETCHED, estimator="drift_sketch", potential_method="step"), 304) == 468


def test_capacity_model_snapshot_bytes_and_publish_of_the_hand_case():
    # bfloat16 state dict with the tied lm_head twice 2·(304 + 40) = 688, m and v 2·2·304 = 1216
    assert snapshot_bytes(HAND, LOAD) == 1904
    assert snapshot_bytes(HAND, replace(LOAD, snapshot_bytes_per_value=4)) == 3808
    assert snapshot_bytes(HAND, InfluenceLoad(estimator="first_order", adam=False)) == 688
    # device→host: 16-bit weights 688, m and v in fp32 8·304 = 2432; host→device: fp32 weights, m, v 12·304
    assert publish_device_to_host_bytes(HAND, LOAD) == 3120
    assert host_to_device_bytes(HAND, LOAD) == 3648
    assert host_to_device_bytes(HAND, SKETCHED) == 3648 + 2 * 4 * 304  # + the reference's 2 directions
    assert snapshot_publish_sec(HAND, LOAD, DEV, 1) == pytest.approx(3120 / 4e3 + 1904 / 1e3)  # 2.684
    # 2 ranks: + gather of 16-bit weights 2·304·½/1e3 = 0.304, + fp32 m, v all-reduce 2·½·2432/1e3 + 0.02
    assert snapshot_publish_sec(HAND, LOAD, DEV, 2) == pytest.approx(2.684 + 0.304 + 2.452)
    # one pull 1.904, get 0.952, host→device 3648/4e3 = 0.912, w 80·304/2e3 = 12.16
    assert snapshot_fetch_sec(HAND, LOAD, DEV, 1) == pytest.approx(15.928)
    assert snapshot_fetch_sec(HAND, LOAD, DEV, 3) == pytest.approx(15.928 + 1.904)  # 2 nodes: 2 pulls
    assert snapshot_score_sec(HAND, LOAD, DEV, 2) == pytest.approx(15.928 + 4 * 28.832)


def test_capacity_model_chunk_cost_of_the_hand_case():
    c = chunk_cost(HAND, LOAD, DEV, 1)
    assert c.step_sec == pytest.approx(91.008) and c.chunk_train_sec == pytest.approx(728.064)
    assert (c.transfer_sec, c.host_to_device_sec, c.drift_sec) == pytest.approx((2.856, 0.912, 12.16))
    assert (c.fwd_bwd_sec, c.coordinate_sec, c.batch_sec) == pytest.approx((22.752, 6.08, 28.832))
    assert c.actor_sec == pytest.approx(15.928 + 8 * 28.832)  # 246.584
    assert c.actor_share == pytest.approx(246.584 / 728.064)  # 0.3387
    assert c.batch_step_ratio == pytest.approx(28.832 / 91.008)
    assert c.gpu_seconds_ratio == pytest.approx(c.actor_share)  # one trainer rank
    assert chunk_cost(HAND, LOAD, DEV, 2).gpu_seconds_ratio == pytest.approx(246.584 / (2 * 364.032))


def test_capacity_model_actor_memory_of_the_hand_case():
    floor = actor_memory_floor(HAND, LOAD)
    assert floor.parts == {"weights (16-bit)": 608, "gradient (fp32)": 1216, "activations": 648,
                           "drift w (fp32)": 1216}
    assert floor.total == 3688
    coded = actor_memory_as_coded(HAND, LOAD)
    # activations of n = 1 in fp32 with SDPA: 12·34·2 = 816 + logits 240; float64 casts of the 64-number tensor
    assert coded.parts == {"weights (fp32)": 1216, "gradient (fp32)": 1216, "activations": 1056,
                           "m, v (fp32)": 2432, "drift w (fp32)": 1216, "float64 casts of g, w (largest tensor)": 1024}
    assert coded.total == 8160
    sketched = actor_memory_as_coded(HAND, SKETCHED)
    # work vectors: u, the stacked [g; u], the reference's two directions, the two running sums = 7
    assert sketched.parts == {"weights (fp32)": 1216, "gradient (fp32)": 1216, "activations": 1056,
                              "m, v (fp32)": 2432, "work vectors (fp32)": 7 * 1216, "sjlt cache": 12 * 4 * 304}
    assert actor_memory_floor(HAND, SKETCHED).parts == {
        "weights (16-bit)": 608, "gradient (fp32)": 1216, "activations": 648, "m, v (16-bit)": 1216,
        "AdamW direction u (fp32)": 1216}
    shard = in_trainer_extra_memory(HAND, LOAD, 4)
    assert shard.parts == {"gradient shards (fp32)": 304, "m, v copies (fp32)": 608, "drift w (fp32)": 304}
    shard = in_trainer_extra_memory(HAND, SKETCHED, 4)
    assert shard.parts == {"gradient shards (fp32)": 304, "m, v copies (fp32)": 608, "work vectors (fp32)": 7 * 304,
                           "sjlt cache": 12 * 4 * 76}
    assert isinstance(shard, Memory)


def test_capacity_model_in_trainer_wait_of_the_hand_case():
    compute = 1896 * 3 / (2 * 1e3 * 0.25)  # one sequence per batch over 2 ranks: 11.376
    gather = 6 * 304 / 2 / 1e3  # 0.912
    coords = (8 * 40 + 80 + 16) * 152 / 2e3  # L potentials, w, the m, v copies over the 152-number shard: 31.616
    scalars = 8 * (2 * 0.5 * 8 / 1e3 + 0.02)  # one f_i all-reduce per batch: 0.224
    assert kvector_bytes(LOAD) == 8 * 8  # L float64 potentials, nothing sketched
    assert kvector_bytes(SKETCHED) == 4 * 2 * 8 * 13
    assert in_trainer_wait_sec(HAND, LOAD, DEV, 2) == pytest.approx(8 * max(compute, gather) + coords + scalars)
    assert in_trainer_wait_sec(HAND, LOAD, DEV, 2) == pytest.approx(122.848)
    # gathered once for all 8 batches: the traffic is paid once, against 8 batches of compute
    per_chunk = replace(LOAD, batches_per_gather=8)
    assert in_trainer_wait_sec(HAND, per_chunk, DEV, 2) == pytest.approx(max(8 * compute, gather) + coords + scalars)
    # the trainers' 16-bit module at twice the MFU halves the forward+backward, nothing else
    bf16 = replace(DEV, mfu_in_trainer=0.5)
    assert in_trainer_wait_sec(HAND, LOAD, bf16, 2) == pytest.approx(8 * compute / 2 + coords + scalars)
    # sketched: L·(u, stack, projection, control variate, sums) = 8·416 + the m, v copies 16, and per batch
    # the (2, 10) projection's all-reduce 2·½·80/1e3 + 0.02 = 0.1
    sketched = (8 * 416 + 16) * 152 / 2e3 + 8 * 0.1
    assert in_trainer_wait_sec(HAND, SKETCHED, DEV, 2) == pytest.approx(8 * compute + sketched)


def test_capacity_model_load_refuses_what_the_code_cannot_run():
    with pytest.raises(ValueError, match="adam"):
        InfluenceLoad(estimator="drift", adam=False)
    with pytest.raises(ValueError, match="estimator"):
        InfluenceLoad(estimator="sketch")
    with pytest.raises(ValueError, match="snapshot_bytes_per_value"):
        InfluenceLoad(snapshot_bytes_per_value=3)


def test_capacity_model_in_trainer_plan_finds_the_largest_fraction_by_hand():
    # A device where only compute counts: wait(n) = L·n·F·T/(W·peak·mfu) = 8·n·1896·3/(1·1e3·1) = 45.504·n;
    # the chunk is 8·1896·24/1e3 = 364.032 s, 2% of it 7.28 s: none fits; 20%: 72.8 s → n = 1; 55%: 200.2 s → n = 4.
    free = DeviceConstants(
        name="compute only", memory_bytes=1e6, peak_flops=1e3, mfu_train=1.0, mfu_influence=1.0,
        memory_bytes_per_sec=1e30,
        put_bytes_per_sec=1e9, get_bytes_per_sec=1e9, host_device_bytes_per_sec=1e9, object_bytes_per_sec=1e9,
        intra_node_bytes_per_sec=1e9, inter_node_bytes_per_sec=1e9, devices_per_node=8, collective_latency_sec=0.0,
    )
    assert in_trainer_plan(HAND, LOAD, free, 1).max_sample_fraction is None
    assert in_trainer_plan(HAND, InfluenceLoad(wait_target=0.2), free, 1).max_sample_fraction == 1 / 8
    assert in_trainer_plan(HAND, InfluenceLoad(wait_target=0.55), free, 1).max_sample_fraction == 4 / 8


def test_capacity_model_snapshot_plan_picks_the_fewest_actors_and_refuses_what_does_not_fit():
    # Publishing is free and a batch costs 1/4 of a training step: one actor scores L batches in L/4 steps.
    free = DeviceConstants(
        name="free links", memory_bytes=1e6, peak_flops=1e3, mfu_train=1.0, mfu_influence=1.0,
        memory_bytes_per_sec=1e30,
        put_bytes_per_sec=1e12, get_bytes_per_sec=1e12, host_device_bytes_per_sec=1e12, object_bytes_per_sec=1e12,
        intra_node_bytes_per_sec=1e12, inter_node_bytes_per_sec=1e12, devices_per_node=8, collective_latency_sec=0.0,
    )
    wide = Architecture(**{**HAND.__dict__, "batch_sequences": 4, "micro_batch": 4})  # n = round(0.5) = 1 of 4
    plan = snapshot_plan(wide, LOAD, free, 1)
    assert plan.actors == 1 and plan.scoring_actors == 1
    assert plan.busy_fraction == pytest.approx(0.25, rel=1e-6)
    # potential: step, two forwards: 2/3 of it
    assert snapshot_plan(wide, STEP, free, 1).busy_fraction == pytest.approx(0.25 * 2 / 3, rel=1e-6)
    # Slower influence: a batch costs 2, 4, 8 steps, so ⌈8/G⌉ batches fit the 8-step chunk from G = 2, 4, 8;
    # at 16 steps a batch even 8 actors (one batch each) finish a chunk late.
    for mfu, actors in ((1 / 8, 2), (1 / 16, 4), (1 / 32, 8), (1 / 64, None)):
        plan = snapshot_plan(wide, LOAD, DeviceConstants(**{**free.__dict__, "mfu_influence": mfu}), 1)
        assert (plan.actors, plan.scoring_actors) == (actors, actors)
    assert "still finish late" in plan.reason
    tiny_gpu = DeviceConstants(**{**free.__dict__, "memory_bytes": 100.0})
    refused = snapshot_plan(wide, InfluenceLoad(), tiny_gpu, 1)
    assert refused.actors is None and refused.scoring_actors is None and "GiB" in refused.reason
