"""Typed training config → the DeepSpeed config dict, and the LR schedule.

Produced at the edge, once per worker, from :class:`~d3ray.train.config.TrainConfig`
(STYLE.md section 3). Precision from ``train.precision`` (``auto``: fp32 on CPU, bf16 on GPU). ``torch_adam`` avoids DeepSpeed op builds.
"""

from __future__ import annotations

import math
from typing import Any

from d3ray.train.config import TrainConfig


def deepspeed_config(cfg: TrainConfig) -> dict[str, Any]:
    """DeepSpeed engine config for ``cfg`` (batch sizes, ZeRO stage, optimizer, precision)."""
    zero: dict[str, Any] = {"stage": cfg.zero_stage}
    if cfg.zero_stage == 3:
        # Snapshots for the influence actors gather the 16-bit weights on rank 0.
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    return {
        "train_batch_size": cfg.global_batch_size,
        "train_micro_batch_size_per_gpu": cfg.micro_batch_size,
        "gradient_accumulation_steps": cfg.grad_accum_steps,
        "gradient_clipping": cfg.grad_clip,
        "optimizer": {
            "type": "AdamW",
            "params": {
                "lr": cfg.lr,
                "betas": list(cfg.betas),
                "weight_decay": cfg.weight_decay,
                "torch_adam": True,
            },
        },
        "zero_optimization": zero,
        "bf16": {"enabled": cfg.bf16},
        "fp16": {"enabled": False},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Linear warmup to 1, then cosine decay to ``min_lr_ratio`` at ``cfg.steps``."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    span = max(1, cfg.steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * cosine
