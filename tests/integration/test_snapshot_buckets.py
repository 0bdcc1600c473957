"""The ZeRO-1/2 optimizer state a snapshot ships, assembled a bucket of parameters at a time
(``d3ray.train.scheduling.snapshot._assembled_fragments``: one all-reduce per bucket), equals DeepSpeed's own
per-parameter assembly (``safe_get_full_optimizer_state``: one all-reduce per parameter and key) bit for
bit, on two real gloo ranks whose flat partitions split parameters between them; with buckets small
enough that a parameter is a bucket of its own and with one bucket for all.

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
from deepspeed.utils import safe_get_full_optimizer_state
from d3ray.model import ModelConfig, build_model, model_config_dict
from d3ray.train.scheduling.snapshot import _assembled_fragments, _flat_partitions, _named_trainable, snapshot_optimizer_state
from d3ray.train.trainer_rank import TrainerRank

deepspeed.init_distributed(dist_backend="gloo")
rank = int(os.environ["RANK"])
torch.manual_seed(0)
cfg = ModelConfig(preset="gpt2-tiny")
model = build_model(model_config_dict(cfg, 96, 16, 0), cfg)
ds = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
      "zero_optimization": {"stage": 2}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
      "bf16": {"enabled": False}}
engine, *_ = deepspeed.initialize(model=model, config=ds, model_parameters=model.parameters())
g = torch.Generator().manual_seed(rank)
for _ in range(2):
    x = torch.randint(0, 96, (2, 16), generator=g)
    engine.backward(engine(input_ids=x, labels=x).loss)
    engine.step()
named = _named_trainable(engine)
reference = {n: (safe_get_full_optimizer_state(p, "exp_avg").clone(), safe_get_full_optimizer_state(p, "exp_avg_sq").clone())
             for n, p in named}
largest = max(p.numel() for _, p in named)
split = sum(p._hp_mapping is not None and p._hp_mapping.lp_fragment_address.numel < p.numel() for _, p in named)
out = {"flat": _flat_partitions(named), "params": len(named), "split_here": int(split)}
for label, cap in (("one_per_bucket", 1), ("mid", largest), ("one_bucket", 1 << 30)):
    got = {n: (m.clone(), v.clone()) for n, _, (m, v) in _assembled_fragments(named, cap)}
    out[label] = sorted(got) == sorted(reference) and all(
        torch.equal(got[n][0], reference[n][0]) and torch.equal(got[n][1], reference[n][1]) for n in reference)
state = snapshot_optimizer_state(TrainerRank(engine, rank, int(os.environ["WORLD_SIZE"]), 2), "float32")
if rank == 0:
    out["shipped"] = all((state.exp_avg[n] == reference[n][0].numpy()).all() and
                         (state.exp_avg_sq[n] == reference[n][1].numpy()).all() for n in reference)
    out["nonzero"] = float(max(v[1].abs().max() for v in reference.values()))
print("RESULT " + json.dumps(out), flush=True)
torch.distributed.barrier()
torch.distributed.destroy_process_group()
"""


def test_bucketed_zero2_optimizer_state_equals_deepspeeds_per_parameter_assembly(tmp_path):
    results = [reported(out) for out in run_ranks(SCRIPT, tmp_path)]
    for r in results:
        assert r["flat"] and r["one_per_bucket"] and r["mid"] and r["one_bucket"], r
    assert results[0]["shipped"] and results[0]["nonzero"] > 0
    assert results[0]["split_here"] + results[1]["split_here"] > 0, "no parameter split across the two ranks"
