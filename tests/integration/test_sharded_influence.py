"""Sharded (in-trainer) influence equals the unsharded sketches: 2 real DeepSpeed ZeRO-3 ranks on CPU.

Two processes (gloo) train a tiny GPT-2 for three steps under ZeRO-3, then score two chunks with
:class:`~d3ray.train.scheduling.sharded_influence.ShardedScorer`, each rank on its own parameter slices. Rank 0
then gathers the full weights and AdamW state (the snapshot path) and sketches the same chunks with
an :class:`~d3ray.influence.worker.InfluenceWorker`: the rows (P g, P u with the AdamW preconditioner,
and the control variate's exact columns against chunk 0's mean directions) must agree within float32
rounding, a masked (NaN) batch (the ``influence_nan_batches`` drill of the run directory's ``faults.json``
for the scorer, the same labels masked by hand for the worker) must be excluded by both, a scorer restored from the saved means must
sketch bit-identically (a resumed trainer), and training must go on afterwards.

Device discipline: every ``torch.distributed`` collective of the run (DeepSpeed's own, the multi-rank
evaluation's, the scorer's reduce-scatters and all-reduces, the snapshot's gathers) goes through a
checking wrapper installed before DeepSpeed starts, which records any tensor that is not on the device
:func:`~d3ray.train.collectives.collective_device` names for its group; there must be none. (On a CPU
box that device is the CPU; the same check with NCCL is ``bench/gpu_check.sh``'s.) The evaluation runs
5 rows on 2 ranks, so one rank takes a zero-weight call, and both ranks must report the same numbers.
"""

from __future__ import annotations

import math

import pytest

from d3ray.faults import FaultPlan, write_plan
from tests.ranks import reported, run_ranks

pytestmark = pytest.mark.slow

SCRIPT = r"""
import dataclasses, json, os, sys
import numpy as np, torch
os.environ["DS_ACCELERATOR"] = "cpu"
import deepspeed
from d3ray.data.labels import lm_labels
from d3ray.influence.config import InfluenceConfig, SjltSketchConfig
from d3ray.influence.estimators import DriftConfig, FirstOrderConfig
from d3ray.influence.worker import InfluenceWorker
from d3ray.model import ModelConfig, build_model
from d3ray.data.chunker import GlobalBatch
from d3ray.train.scheduling.sharded_influence import ShardedScorer
from d3ray.train.scheduling.snapshot import snapshot_optimizer_state, snapshot_weights

from d3ray.train.collectives import collective_device
from d3ray.train.evaluation import evaluate
from d3ray.train.trainer_rank import TrainerRank

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.set_num_threads(1)
import torch.distributed as dist
calls, strays = {}, []
def checked(name, fn):
    def wrapper(*args, **kwargs):
        group = kwargs.get("group", next((a for a in args if isinstance(a, dist.ProcessGroup)), None))
        want = collective_device(group)
        values = list(args) + list(kwargs.values())
        tensors = [t for v in values for t in (v if isinstance(v, (list, tuple)) else [v]) if torch.is_tensor(t)]
        strays.extend(f"{name}: {t.device} in a group that wants {want}" for t in tensors if t.device != want)
        calls[name] = calls.get(name, 0) + 1
        return fn(*args, **kwargs)
    return wrapper
for name in ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
             "broadcast", "reduce", "gather", "scatter", "all_to_all_single"):
    setattr(dist, name, checked(name, getattr(dist, name)))  # before DeepSpeed binds them
deepspeed.init_distributed(dist_backend="gloo")
config_dict = {"model_type": "gpt2", "n_layer": 2, "n_embd": 24, "n_head": 2, "vocab_size": 96, "n_positions": 16,
               "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
torch.manual_seed(0)
model = build_model(config_dict, ModelConfig(attn_implementation="eager"))
ds = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
      "gradient_clipping": 1.0,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "betas": [0.9, 0.95], "weight_decay": 0.1, "torch_adam": True}},
      "zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": True}}
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds)
trainer = TrainerRank(engine, rank, world, 3)
rng = np.random.default_rng(0)
def batch(seed):
    r = np.random.default_rng(seed)
    ids = r.integers(0, 96, size=(8, 16)).astype(np.int32)
    n = np.full(8, 16, dtype=np.int32); n[3] = 11  # one padded row
    return GlobalBatch(input_ids=ids, n_tokens=n, sample_ids=tuple(f"s{seed}:{i}" for i in range(8)), domains=("a",) * 8)
for step in range(3):
    x = torch.as_tensor(rng.integers(0, 96, size=(2, 16)))
    engine.backward(engine(input_ids=x, labels=x).loss)
    engine.step()
eval_rows = np.random.default_rng(7).integers(0, 96, size=(5, 16))
evaluated = evaluate(trainer, {"a": eval_rows, "ood:b": eval_rows[:3]}, 2, torch.device("cpu"))
eval_calls = calls.get("all_reduce", 0)
print("EVAL " + json.dumps(evaluated), flush=True)
chunks = {0: [batch(10 + i) for i in range(4)], 1: [batch(20 + i) for i in range(4)]}
ids = {0: [0, 1, 2, 3], 1: [4, 5, 6, 7]}
nan_batch = 6
results = {}
for name, cfg in {
    "adam_cv": InfluenceConfig(estimator=FirstOrderConfig(), preconditioner="adam", sample_fraction=0.375, sketch=SjltSketchConfig(k=64)),
    "plain": InfluenceConfig(estimator=FirstOrderConfig(), preconditioner="none", control_variate=False, sample_fraction=0.5, sketch=SjltSketchConfig(k=64)),
    "drift": InfluenceConfig(estimator=DriftConfig(residual="sketch"), preconditioner="adam", sample_fraction=0.375, sketch=SjltSketchConfig(k=64)),
    "drift_only": InfluenceConfig(preconditioner="adam", sample_fraction=0.375, sketch=SjltSketchConfig(k=64)),
    # one sampled row a batch, fewer than the ranks: each pass runs two batches, one a rank
    "adam_cv_one_row": InfluenceConfig(estimator=FirstOrderConfig(), preconditioner="adam", sample_fraction=0.125, sketch=SjltSketchConfig(k=64)),
    "drift_only_one_row": InfluenceConfig(preconditioner="adam", sample_fraction=0.125, sketch=SjltSketchConfig(k=64)),
}.items():
    scorer = ShardedScorer(trainer, cfg, run_dir=os.getcwd())  # the cwd's faults.json masks nan_batch
    sharded = {c: scorer.score(c, chunks[c], ids[c]) for c in (0, 1)}
    # a trainer restarted from a checkpoint: a new scorer with the saved means sketches chunk 1 alike
    scorer.save(os.getcwd())
    resumed = ShardedScorer(trainer, cfg, run_dir=os.getcwd())
    resumed.load(os.getcwd())
    again = resumed.score(1, chunks[1], ids[1])
    weights = snapshot_weights(trainer, "float32")
    state = snapshot_optimizer_state(trainer, "float32")
    if rank == 0:
        worker = InfluenceWorker(config_dict, cfg)
        def inputs(c):
            out = []
            for b, bid in zip(chunks[c], ids[c]):
                labels = lm_labels(np.asarray(b.input_ids, dtype=np.int64), b.n_tokens, b.loss_mask)
                if bid == nan_batch:
                    labels[:] = -100
                out.append({"input_ids": np.asarray(b.input_ids, dtype=np.int64), "labels": labels})
            return out
        first = worker.sketch_batches([weights, state], inputs(0), ids[0], return_means=True)
        second = worker.sketch_batches([weights, state], inputs(1), ids[1], reference=first.means)
        k = cfg.sketch.k
        def err(a, b):
            return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-12))
        if second.G.size == 0:  # the potential alone (the default drift): nothing sketched
            results[name] = {"excluded": [sharded[1].excluded, second.excluded], "width": [sharded[1].G.shape[1], 0],
                             "potential": err(sharded[1].potential, second.potential),
                             "resumed_equal": bool(np.array_equal(again.potential, sharded[1].potential))}
            continue
        results[name] = {
            "excluded": [sharded[1].excluded, second.excluded],
            "losses": float(np.nanmax(np.abs(sharded[1].losses - second.losses))),
            "chunk0_plain_G": err(sharded[0].G[:, :k], first.G[:, :k]) if not cfg.control_variate else None,
            "G": err(sharded[1].G, second.G),
            "U": None if second.U is None else err(sharded[1].U, second.U),
            "cv_columns": err(sharded[1].G[:, k:], second.G[:, k:]) if cfg.control_variate else None,
            "width": [sharded[1].G.shape[1], second.G.shape[1]],
            "step_size": [sharded[1].step_size, second.step_size],
            "nonzero": float(np.abs(second.G).max()),
            "potential": None if second.potential is None else err(sharded[1].potential, second.potential),
            "resumed_equal": bool(np.array_equal(again.G, sharded[1].G) and (again.U is None or np.array_equal(again.U, sharded[1].U))),
        }
x = torch.as_tensor(rng.integers(0, 96, size=(2, 16)))
loss = engine(input_ids=x, labels=x).loss
engine.backward(loss)
engine.step()
if rank == 0:
    results["train_after"] = float(loss.detach())
    results["collectives"], results["strays"], results["eval_all_reduces"] = calls, strays[:10], eval_calls
    print("RESULT " + json.dumps(results), flush=True)
torch.distributed.barrier()  # both ranks done before either tears gloo down (else "terminate called" at exit)
torch.distributed.destroy_process_group()
"""


def test_sharded_sketches_equal_unsharded_under_zero3(tmp_path):
    write_plan(tmp_path, FaultPlan(influence_nan_batches=[6]))  # the drill masks batch 6 (the script's nan_batch)
    outs = run_ranks(SCRIPT, tmp_path)
    out = reported(outs[0])

    for name, r in ((n, out[n]) for n in ("adam_cv", "plain", "drift", "adam_cv_one_row")):
        assert r["excluded"] == [[6], [6]], (name, r)  # the masked batch, by both paths
        assert r["width"][0] == r["width"][1] and r["step_size"][0] == pytest.approx(r["step_size"][1])
        assert r["nonzero"] > 0
        assert r["losses"] < 1e-5
        # float32: the two paths sum the same products in different orders (a reduce-scatter of two
        # ranks' partial gradients vs one backward); relative to the largest entry.
        assert r["G"] < 1e-4, (name, r)
        assert r["resumed_equal"], name  # the means in the checkpoint make a resumed rank sketch identically
    for name in ("adam_cv", "adam_cv_one_row"):
        assert out[name]["U"] < 1e-4 and out[name]["cv_columns"] < 1e-4, name
    assert out["plain"]["U"] is None and out["plain"]["chunk0_plain_G"] < 1e-4
    # drift: f_i = Σ over ranks of ⟨g slice, w slice⟩ equals the unsharded worker's; the residual rows too
    assert out["drift"]["potential"] < 1e-4 and out["drift"]["U"] < 1e-4 and out["adam_cv"]["potential"] is None
    for name in ("drift_only", "drift_only_one_row"):  # the default: the potential alone, one scalar a batch
        only = out[name]
        assert only["potential"] < 1e-4 and only["width"] == [0, 0] and only["excluded"] == [[6], [6]], name
        assert only["resumed_equal"], name
    assert math.isfinite(out["train_after"])  # training goes on after scoring
    # every collective on its group's device, and the paths checked did run collectives
    assert out["strays"] == []
    calls = out["collectives"]
    assert out["eval_all_reduces"] >= 2 and calls["all_to_all_single"] > 0 and calls["all_gather_into_tensor"] > 0
    evals = [reported(o, "EVAL") for o in outs]
    assert evals[0] == evals[1] and math.isfinite(evals[0]["eval/a/loss"]) and math.isfinite(evals[0]["eval/a/loss_se"])
