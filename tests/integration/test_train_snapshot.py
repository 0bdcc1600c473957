"""The optimizer-state snapshot of real DeepSpeed engines (CPU, gloo, ZeRO 0-3) predicts the next step.

Each stage runs in a fresh process (DeepSpeed keeps process-global state): three training steps, then
``snapshot_weights`` + ``snapshot_optimizer_state`` (float32, and the bfloat16 the D3 runs ship by
default, which must be the float32 snapshot rounded); the AdamW step the influence path computes from
that snapshot for the next batch (:func:`~d3ray.influence.optimizer.adamw_direction`, gradient from a
plain transformers model at the snapshot weights) must be the step the engine then takes. DeepSpeed
clips gradients at 1.0 by default: the state carries the clip and the step uses it.

Then, in the same process, the same stage trains in bfloat16 (DeepSpeed's CPU accelerator has it: the
precision is not the device's): its snapshot's m and v must be non-zero and exactly the values the torch
optimizer holds (ZeRO-0 keys them by fp32 master copies of the bf16 weights, ZeRO 1-3 by flat
partitions; as multisets, padding zeros aside), under every stage, and the fp32 engine's alike.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = r"""
import json, os, sys
import numpy as np, torch
os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", DS_ACCELERATOR="cpu")
import deepspeed, transformers
from d3ray.influence.optimizer import adamw_direction
from d3ray.train.scheduling.snapshot import snapshot_nbytes, snapshot_optimizer_state, snapshot_weights
from d3ray.train.trainer_rank import TrainerRank

stage = int(sys.argv[1])
def own_state_equal(engine, state):
    # the snapshot's m and v are the torch optimizer's own values (sorted, zeros dropped: partitions pad)
    base = getattr(engine.optimizer, "optimizer", engine.optimizer)
    for key, shipped in (("exp_avg", state.exp_avg), ("exp_avg_sq", state.exp_avg_sq)):
        own = torch.cat([st[key].detach().float().reshape(-1) for st in base.state.values()])
        mine = torch.cat([torch.as_tensor(np.asarray(v)).float().reshape(-1) for v in shipped.values()])
        if not torch.equal(own[own != 0].sort().values, mine[mine != 0].sort().values):
            return False
    return True


torch.set_num_threads(1)
deepspeed.init_distributed(dist_backend="gloo")
torch.manual_seed(0)
cfg = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=16,
                              resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
zero = {"stage": stage, **({"stage3_gather_16bit_weights_on_model_save": True} if stage == 3 else {})}
ds = {"train_batch_size": 2, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "betas": [0.9, 0.95], "weight_decay": 0.1,
                                                "torch_adam": True}},
      "zero_optimization": zero, "bf16": {"enabled": False}}
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds)
one = TrainerRank(engine, 0, 1, stage)  # the one rank of one
fresh = snapshot_optimizer_state(one, "float32")  # what a run publishes before its first step
fresh16 = snapshot_optimizer_state(one, "bfloat16")
rng = np.random.default_rng(0)
batches = [torch.tensor(rng.integers(0, 64, size=(2, 12))) for _ in range(4)]
for x in batches[:3]:
    engine.backward(engine(input_ids=x, labels=x).loss)
    engine.step()
state = snapshot_optimizer_state(one, "float32")
own_equal = own_state_equal(engine, state)  # before the engine steps again
before = snapshot_weights(one, "float32")
state16 = snapshot_optimizer_state(one, "bfloat16")
before16 = snapshot_weights(one, "bfloat16")
pairs = ([(before16[k], before[k]) for k in before] + [(state16.exp_avg[n], state.exp_avg[n]) for n in state.exp_avg]
         + [(state16.exp_avg_sq[n], state.exp_avg_sq[n]) for n in state.exp_avg])
plain = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
plain.load_state_dict({k: torch.from_numpy(v) for k, v in before.items()})
x = batches[3]
plain(input_ids=x, labels=x).loss.backward()
params = {n: p.detach() for n, p in plain.named_parameters()}
u = adamw_direction(params, {n: p.grad for n, p in plain.named_parameters()}, state,
                    state.tensors(params, torch.device("cpu"), torch.float32))
engine.backward(engine(input_ids=x, labels=x).loss)
engine.step()
after = snapshot_weights(one, "float32")


torch.manual_seed(0)
model16 = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
engine16, *_ = deepspeed.initialize(model=model16, model_parameters=model16.parameters(),
                                    config={**ds, "bf16": {"enabled": True}})
one16 = TrainerRank(engine16, 0, 1, stage)
for x in batches[:3]:
    engine16.backward(engine16(input_ids=x, labels=x).loss)
    engine16.step()
trained16 = snapshot_optimizer_state(one16, "float32")
shipped16 = snapshot_optimizer_state(one16, "bfloat16")
weights16 = snapshot_weights(one16, "bfloat16")
out = {"own_equal": own_equal, "bf16_own_equal": own_state_equal(engine16, trained16),
       "bf16_training": next(engine16.module.parameters()).dtype == torch.bfloat16,
       "bf16_step": trained16.step, "bf16_nonzero_v": all(bool(np.any(v > 0)) for v in trained16.exp_avg_sq.values()),
       "bf16_nonzero_m": all(bool(np.any(m != 0)) for m in trained16.exp_avg.values()),
       "bf16_shipped_rounded": all(torch.equal(shipped16.exp_avg_sq[n], torch.from_numpy(trained16.exp_avg_sq[n]).bfloat16())
                                   for n in trained16.exp_avg_sq),
       "bf16_weights": sorted(weights16) == sorted(before) and all(w.dtype == torch.bfloat16 for w in weights16.values()),
       "fresh_step": fresh.step, "fresh_zero": all(not np.any(v) for v in fresh.exp_avg_sq.values()),
       "fresh_names": sorted(fresh.exp_avg) == sorted(state.exp_avg), "step": state.step, "clip": state.max_grad_norm, "names": sorted(state.exp_avg),
       "shapes_match": all(state.exp_avg[n].shape == before[n].shape for n in state.exp_avg),
       "nonzero_v": all(bool(np.any(v > 0)) for v in state.exp_avg_sq.values()),
       "max_error": max(float(np.abs((after[n] - before[n]) + state.lr * u[n].numpy()).max()) for n in params),
       "max_step": max(float(np.abs(after[n] - before[n]).max()) for n in params),
       "bf16_tensors": all(isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16 for a, _ in pairs),
       "bf16_rounded": all(torch.equal(a, torch.from_numpy(b).bfloat16()) for a, b in pairs),
       "bf16_fresh": fresh16.step == 0 and all(v.dtype == torch.bfloat16 and not v.any() for v in fresh16.exp_avg_sq.values()),
       "bytes": [snapshot_nbytes([before, state]), snapshot_nbytes([before16, state16])]}
print("RESULT " + json.dumps(out))
torch.distributed.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


STAGES = [0, 1, 2, 3]


@pytest.fixture(scope="module")
def stage_runs(tmp_path_factory) -> dict[int, subprocess.Popen]:
    """The four stages' processes, started together (each is mostly imports: they overlap on a small box)."""
    runs = {}
    for stage in STAGES:
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
                   PYTHONPATH=str(Path(__file__).resolve().parents[2]))
        runs[stage] = subprocess.Popen([sys.executable, "-c", SCRIPT, str(stage)], env=env, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True, cwd=tmp_path_factory.mktemp(f"zero{stage}"))
    yield runs
    for run in runs.values():
        run.kill()


@pytest.mark.parametrize("stage", STAGES)
def test_snapshot_optimizer_state_predicts_the_engines_next_step(stage, stage_runs):
    stdout, stderr = stage_runs[stage].communicate(timeout=600)
    lines = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")]
    assert stage_runs[stage].returncode == 0 and lines, stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT "):])

    assert out["fresh_step"] == 0 and out["fresh_zero"] and out["fresh_names"]
    assert out["step"] == 3 and out["clip"] == 1.0
    assert out["shapes_match"] and out["nonzero_v"]
    assert "transformer.wte.weight" in out["names"] and "lm_head.weight" not in out["names"]  # tied, once
    # float32 rounding of one AdamW update (steps are ~1e-2, the rounding of m/(√v + ε) ~1e-7 relative)
    assert out["max_error"] <= 1e-6 * max(1.0, out["max_step"] / 1e-2)
    # the 16-bit snapshot: the same collectives' result, each value rounded once to bfloat16, half the bytes
    assert out["bf16_tensors"] and out["bf16_rounded"] and out["bf16_fresh"]
    fp32_bytes, bf16_bytes = out["bytes"]
    assert bf16_bytes * 2 == fp32_bytes > 0
    # the optimizer's own m and v, fp32 and bf16 training alike; bf16 training on the CPU, under every stage
    assert out["own_equal"] and out["bf16_own_equal"], out
    # the torch optimizer's own count, which its bias correction uses: DeepSpeed's ZeRO-0 16-bit wrapper
    # (FP16_UnfusedOptimizer) takes one step on zero gradients when it starts
    assert out["bf16_training"] and out["bf16_step"] == (4 if stage == 0 else 3) and out["bf16_weights"]
    assert out["bf16_nonzero_v"] and out["bf16_nonzero_m"] and out["bf16_shipped_rounded"]
