"""Training precision is its own setting, apart from the device: bf16 runs on the CPU (DeepSpeed's CPU
accelerator has it), fp32 on a GPU, and ``auto`` keeps the old pairing (bf16 on GPUs, fp32 on the CPU)."""

from __future__ import annotations

import pytest

from d3ray.train.config import TrainConfig
from d3ray.train.deepspeed_config import deepspeed_config


@pytest.mark.parametrize(
    ("precision", "gpus", "bf16"),
    [("auto", 0.0, False), ("auto", 1.0, True), ("bf16", 0.0, True), ("fp32", 1.0, False), ("bf16", 1.0, True)],
)
def test_deepspeed_config_precision_apart_from_device_sets_bf16(precision, gpus, bf16):
    cfg = TrainConfig(precision=precision, gpus_per_worker=gpus, num_workers=1)
    assert deepspeed_config(cfg)["bf16"] == {"enabled": bf16}
    assert deepspeed_config(cfg)["fp16"] == {"enabled": False}


def test_train_config_unknown_precision_raises_naming_the_field():
    with pytest.raises(ValueError, match=r"train\.precision='fp16'"):
        TrainConfig(precision="fp16")
