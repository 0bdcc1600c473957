"""In-trainer drift potential equals the influence actor's: 2 real DeepSpeed ranks on CPU, ZeRO-2 and ZeRO-0.

Two processes (gloo) train a tiny GPT-2 for three steps, then score two chunks with
:class:`~d3ray.train.scheduling.trainer_potential.TrainerPotential`, each rank half of the batches on its own whole
module. Rank 0 then takes the snapshot the actors would get (weights and AdamW state) and scores the same
chunks with an :class:`~d3ray.influence.worker.InfluenceWorker`: the potentials f and the losses must
agree to float32 rounding, a batch masked by the run directory's ``faults.json`` drill must be excluded
by both, both ranks must hold the same numbers, scoring must leave the engine's weights bit for bit as
they were, and training must go on afterwards. A chunk of 3 batches on 2 ranks gives one rank one batch.
"""

from __future__ import annotations

import pytest

from d3ray.faults import FaultPlan, write_plan
from tests.ranks import reported, run_ranks

pytestmark = pytest.mark.slow

SCRIPT = r"""
import json, os, sys
import numpy as np, torch
os.environ["DS_ACCELERATOR"] = "cpu"
import deepspeed
from d3ray.data.chunker import GlobalBatch
from d3ray.data.labels import lm_labels
from d3ray.influence.config import InfluenceConfig
from d3ray.influence.worker import InfluenceWorker
from d3ray.model import ModelConfig, build_model
from d3ray.train.scheduling.snapshot import snapshot_optimizer_state, snapshot_weights
from d3ray.train.scheduling.trainer_potential import TrainerPotential
from d3ray.train.trainer_rank import TrainerRank

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.set_num_threads(1)
deepspeed.init_distributed(dist_backend="gloo")
config_dict = {"model_type": "gpt2", "n_layer": 2, "n_embd": 24, "n_head": 2, "vocab_size": 96, "n_positions": 16,
               "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
cfg = InfluenceConfig(preconditioner="adam", sample_fraction=0.375)  # the default estimator: drift, potential step
assert cfg.potential_alone
def batch(seed):
    r = np.random.default_rng(seed)
    ids = r.integers(0, 96, size=(8, 16)).astype(np.int32)
    n = np.full(8, 16, dtype=np.int32); n[3] = 11  # one padded row
    return GlobalBatch(input_ids=ids, n_tokens=n, sample_ids=tuple(f"s{seed}:{i}" for i in range(8)), domains=("a",) * 8)
chunks = {0: [batch(10 + i) for i in range(4)], 1: [batch(20 + i) for i in range(3)]}
ids = {0: [0, 1, 2, 3], 1: [4, 5, 6]}
nan_batch = 5
results = {}
for stage in (2, 0):
    torch.manual_seed(0)
    model = build_model(config_dict, ModelConfig(attn_implementation="sdpa"))
    ds = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
          "gradient_clipping": 1.0,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "betas": [0.9, 0.95], "weight_decay": 0.1, "torch_adam": True}},
          "zero_optimization": {"stage": stage}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds)
    trainer = TrainerRank(engine, rank, world, stage)
    rng = np.random.default_rng(0)
    for step in range(3):
        x = torch.as_tensor(rng.integers(0, 96, size=(2, 16)))
        engine.backward(engine(input_ids=x, labels=x).loss)
        engine.step()
    before = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
    scorer = TrainerPotential(trainer, cfg, run_dir=os.getcwd())  # the cwd's faults.json masks nan_batch
    scored = {c: scorer.score(c, chunks[c], ids[c]) for c in (0, 1)}
    untouched = all(torch.equal(before[n], p) for n, p in engine.module.named_parameters())
    weights = snapshot_weights(trainer, "float32")
    state = snapshot_optimizer_state(trainer, "float32")
    mine = {str(c): [list(map(float, s.potential)), list(map(float, s.losses)), s.excluded] for c, s in scored.items()}
    out = {"untouched": untouched, "mine": mine, "training": engine.module.training}
    if rank == 0:
        worker = InfluenceWorker(config_dict, cfg)
        for c in (0, 1):
            inputs = []
            for b, bid in zip(chunks[c], ids[c]):
                labels = lm_labels(np.asarray(b.input_ids, dtype=np.int64), b.n_tokens, b.loss_mask)
                if bid == nan_batch:
                    labels[:] = -100
                inputs.append({"input_ids": np.asarray(b.input_ids, dtype=np.int64), "labels": labels})
            actor = worker.sketch_batches([weights, state], inputs, ids[c])
            ours = scored[c]
            finite = np.isfinite(actor.losses)
            out[f"chunk{c}"] = {
                "potential": float(np.abs(ours.potential - actor.potential).max() / np.abs(actor.potential).max()),
                "losses": float(np.abs(ours.losses[finite] - actor.losses[finite]).max()),
                "excluded": [ours.excluded, actor.excluded], "width": ours.G.shape[1],
                "step_size": [ours.step_size, state.lr], "nonzero": float(np.abs(actor.potential).max()),
            }
    x = torch.as_tensor(rng.integers(0, 96, size=(2, 16)))
    loss = engine(input_ids=x, labels=x).loss
    engine.backward(loss)
    engine.step()
    out["train_after"] = float(loss.detach())
    results[str(stage)] = out
print("RESULT " + json.dumps(results), flush=True)
torch.distributed.barrier()
torch.distributed.destroy_process_group()
"""


def test_trainer_potential_equals_the_actors_under_zero2_and_zero0(tmp_path):
    write_plan(tmp_path, FaultPlan(influence_nan_batches=[5]))  # the drill masks batch 5 (the script's nan_batch)
    zero, one = (reported(out) for out in run_ranks(SCRIPT, tmp_path))
    for stage in ("2", "0"):
        r = zero[stage]
        assert r["mine"] == one[stage]["mine"], stage  # the all-reduce gives every rank the chunk's numbers
        assert r["untouched"] and one[stage]["untouched"] and r["training"], stage  # scoring moves no weight
        assert r["train_after"] == r["train_after"]  # training goes on (a finite loss)
        for c in ("chunk0", "chunk1"):
            got = r[c]
            assert got["width"] == 0 and got["nonzero"] > 0
            assert got["step_size"][0] == pytest.approx(got["step_size"][1])
            # float32: the same two forwards, the trainers' passes stacking other sequences than the actor's
            assert got["potential"] < 1e-4, (stage, c, got)
            assert got["losses"] < 1e-5, (stage, c, got)
        assert r["chunk0"]["excluded"] == [[], []]
        assert r["chunk1"]["excluded"] == [[5], [5]], r["chunk1"]  # masked by the drill and by hand, excluded by both
