"""Under ZeRO-3 ``build_model`` constructs the model partitioned (inside ``deepspeed.zero.Init``) with the
values a plain build would load: a pretrained directory's weights exactly; a random init is rank 0's
values for the torch seed (the same seed, the same values; another seed, others). Outside a process
group a ZeRO-3 build is refused.

One rank in a fresh process (DeepSpeed and transformers keep process-global state); the two-rank
partition sizes are asserted by the ZeRO-3 run of tests/integration/test_d3_pipeline.py.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

SCRIPT = r"""
import json, os, sys, tempfile
import torch, transformers
from d3ray.model import ModelConfig, build_model, model_config_dict

ds = {"train_batch_size": 2, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
      "zero_optimization": {"stage": 3}, "bf16": {"enabled": False}}
small = dict(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=300)
out = {}
# before the process group exists: refused (a ZeRO-3 model is built partitioned, by the trainers)
try:
    build_model(model_config_dict(ModelConfig(), 300, 32, 0), ModelConfig(), ds)
    out["refused"] = False
except RuntimeError as err:
    out["refused"] = "process group" in str(err)
os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
import deepspeed
deepspeed.init_distributed(dist_backend="gloo")

def gathered(model):
    with deepspeed.zero.GatheredParameters(list(model.parameters())):
        return {k: v.clone() for k, v in model.state_dict().items()}

def seeded(cfg, seed):
    torch.manual_seed(seed)
    model = build_model(model_config_dict(cfg, 300, 32, 0), cfg, ds)
    return model, gathered(model)

for preset in ("gpt2-tiny", "llama-tiny"):
    cfg = ModelConfig(preset=preset)
    model, state = seeded(cfg, 0)
    again, other = seeded(cfg, 0)[1], seeded(cfg, 1)[1]
    out[preset] = {"partitioned": all(p.numel() == 0 and p.ds_numel > 0 for p in model.parameters()),
                   "equal": sorted(state) == sorted(again) and all(torch.equal(state[k], again[k]) for k in state)
                            and any(not torch.equal(state[k], other[k]) for k in state)}
for arch, config in (("qwen2", transformers.Qwen2Config(**small)), ("mistral", transformers.MistralConfig(**small))):
    root = tempfile.mkdtemp()
    saved = transformers.AutoModelForCausalLM.from_config(config)
    saved.save_pretrained(root)
    cfg = ModelConfig(pretrained_path=root)
    model = build_model(model_config_dict(cfg, 300, 32, 0), cfg, ds)
    state, reference = gathered(model), saved.state_dict()
    out[arch] = {"partitioned": all(p.numel() == 0 and p.ds_numel > 0 for p in model.parameters()),
                 "equal": sorted(state) == sorted(reference) and all(torch.equal(state[k], reference[k]) for k in state)}
print("RESULT" + json.dumps(out))
"""


def test_build_model_zero3_partitioned_holds_the_pretrained_weights_and_a_seeded_random_init():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(port)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "DS_ACCELERATOR": "cpu"})
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT")), None)
    assert line is not None, proc.stderr[-3000:]
    result = json.loads(line[len("RESULT"):])
    assert result == {"refused": True, **{name: {"partitioned": True, "equal": True}
                                          for name in ("gpt2-tiny", "llama-tiny", "qwen2", "mistral")}}
