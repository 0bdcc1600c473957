"""The finetune benchmark's plain-torch reference: the same two models, one process, no DeepSpeed."""

import pytest

from d3ray.config import RunConfig
from d3ray.config_loading import load_config
from d3ray.lab.bench.finetune import plain_torch_reference
from d3ray.run.command import FINETUNE_DEFAULTS


def test_plain_torch_reference_times_the_full_model_and_its_lora_adapters(tmp_path):
    common = [*FINETUNE_DEFAULTS, f"--output_dir={tmp_path}", "--model.preset=gpt2-tiny"]
    configs = {"full": load_config(RunConfig, None, [*common, "--name=full"]),
               "lora": load_config(RunConfig, None, [*common, "--model.lora={r: 4}", "--name=lora"])}
    ref = plain_torch_reference(configs, steps=2)
    full, lora = ref["full"], ref["lora"]
    # only the adapters train: per layer of gpt2-tiny (64 wide), r (d_in + d_out) for c_attn, the
    # attention's c_proj, c_fc and the MLP's c_proj (the name "c_proj" matches both)
    assert lora["trainable_parameters"] == 2 * 4 * ((64 + 192) + (64 + 64) + (64 + 256) + (256 + 64))
    assert full["trainable_parameters"] > 10 * lora["trainable_parameters"]  # every weight of the model
    for phases in (full, lora):
        assert all(phases[f"median_{name}_sec"] > 0 for name in ("forward", "backward", "optimizer"))
    assert ref["lora_speedup_per_step_median"] == pytest.approx(full["median_step_sec"] / lora["median_step_sec"])
