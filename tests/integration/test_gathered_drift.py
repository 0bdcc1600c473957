"""The drift w each rank computes on its own ZeRO-1/2 partition and the ranks sum
(``d3ray.train.scheduling.snapshot.gathered_drift``) equals w computed from the whole AdamW state
(``full_optimizer_state`` + ``drift_direction``, what the trainers' scoring did before) bit for bit, on two
real gloo ranks whose flat partitions split parameters between them: ZeRO-1 and ZeRO-2, one bucket and
buckets smaller than a parameter (the sum asynchronous: what the function it returns waits for). None before the first step and under ZeRO-0 (the callers then read the
whole state). The in-trainer potential's own figures go through it: tests/integration/test_trainer_potential.py.

No Ray: two processes (this file's SCRIPT), as DeepSpeed runs its ranks."""

from __future__ import annotations

import pytest

from tests.ranks import reported, run_ranks

pytestmark = pytest.mark.slow

SCRIPT = r"""
import json, os
import torch
os.environ.setdefault("DS_ACCELERATOR", "cpu")
import deepspeed
from d3ray.influence.drift import drift_direction
from d3ray.model import ModelConfig, build_model, model_config_dict
from d3ray.train.scheduling import snapshot
from d3ray.train.trainer_rank import TrainerRank

deepspeed.init_distributed(dist_backend="gloo")
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
out = {}
for stage in (0, 1, 2):
    torch.manual_seed(0)
    cfg = ModelConfig(preset="gpt2-tiny")
    model = build_model(model_config_dict(cfg, 96, 16, 0), cfg)
    ds = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
          "zero_optimization": {"stage": stage},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.1, "torch_adam": True}},
          "bf16": {"enabled": False}}
    engine, *_ = deepspeed.initialize(model=model, config=ds, model_parameters=model.parameters())
    trainer = TrainerRank(engine, rank, world, stage)
    r = {"before_first_step": snapshot.gathered_drift(trainer) is None}
    g = torch.Generator().manual_seed(rank)
    for _ in range(2):
        x = torch.randint(0, 96, (2, 16), generator=g)
        engine.backward(engine(input_ids=x, labels=x).loss)
        engine.step()
    whole = snapshot.full_optimizer_state(trainer)
    params = {n: p.detach().to(torch.float32) for n, p in engine.module.named_parameters() if p.requires_grad}
    reference = {n: t.clone() for n, t in drift_direction(params, whole, whole.tensors(params, torch.device("cpu"), torch.float32)).items()}
    named = snapshot._named_trainable(engine)
    largest = max(p.numel() for _, p in named)
    for label, cap in (("one_bucket", 1 << 30), ("small_buckets", largest // 3)):
        snapshot.STATE_BUCKET_NUMEL = cap
        gathered = snapshot.gathered_drift(trainer)
        if gathered is None:
            r[label] = None
            continue
        state, ready = gathered
        w = ready()
        r[label + "_again"] = ready() is w  # a second call waits for nothing and returns the same w
        r[label] = sorted(w) == sorted(reference) and all(torch.equal(w[n], reference[n]) for n in reference)
        r[label + "_hyper"] = [state.lr == whole.lr, state.step == whole.step, state.betas == whole.betas,
                               state.weight_decay == whole.weight_decay, state.eps == whole.eps,
                               not state.exp_avg and not state.exp_avg_sq]
    r["nonzero"] = float(max(t.abs().max() for t in reference.values()))
    r["split_here"] = int(sum(getattr(p, "_hp_mapping", None) is not None
                              and p._hp_mapping.lp_fragment_address.numel < p.numel() for _, p in named))
    out[str(stage)] = r
    snapshot.STATE_BUCKET_NUMEL = 1 << 24
print("RESULT " + json.dumps(out), flush=True)
torch.distributed.barrier()
torch.distributed.destroy_process_group()
"""


def test_drift_summed_from_each_ranks_partition_equals_w_from_the_whole_state(tmp_path):
    results = [reported(out) for out in run_ranks(SCRIPT, tmp_path)]
    for r in results:
        assert r["0"]["one_bucket"] is None and r["0"]["small_buckets"] is None, r["0"]  # ZeRO-0: the whole state
        for stage in ("1", "2"):
            got = r[stage]
            assert got["before_first_step"], (stage, got)  # no moments yet: the caller's fresh state
            assert got["one_bucket"] and got["small_buckets"], (stage, got)
            assert got["one_bucket_again"] and got["small_buckets_again"], (stage, got)
            assert all(got["one_bucket_hyper"]) and all(got["small_buckets_hyper"]), (stage, got)
            assert got["nonzero"] > 0
    for stage in ("1", "2"):
        assert results[0][stage]["split_here"] + results[1][stage]["split_here"] > 0, "no parameter split across ranks"
