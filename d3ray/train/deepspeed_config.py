"""Typed training config → the DeepSpeed config dict, and the LR schedule.

Produced at the edge, once per worker, from :class:`~d3ray.train.config.TrainConfig`
(docs/design/conventions.md §1). Precision from ``train.precision`` (``auto``: fp32 on CPU, bf16 on GPU). ``torch_adam`` avoids DeepSpeed op builds.
``train.deepspeed`` (a DeepSpeed JSON fragment: offload, bucket sizes, ...) is merged over the generated
dict by :func:`merge_deepspeed_overrides`, which refuses any key a typed field owns (``OWNED``).
"""

from __future__ import annotations

import copy
import math
from typing import TYPE_CHECKING, Any

from d3ray.errors import UserError

if TYPE_CHECKING:  # TrainConfig.__post_init__ imports this module: a type only, no import circle
    from d3ray.train.config import TrainConfig

# DeepSpeed keys (dotted paths) that d3ray's typed fields set -> the field to set instead. A user value for
# one of them must equal the generated one (or be "auto", as in Hugging Face Trainer DeepSpeed JSONs).
OWNED: dict[str, str] = {
    "train_batch_size": "train.global_batch_size",
    "train_micro_batch_size_per_gpu": "train.micro_batch_size",
    "gradient_accumulation_steps": "train.global_batch_size / (train.num_workers * train.micro_batch_size)",
    "gradient_clipping": "train.grad_clip",
    "optimizer.type": "d3ray's AdamW (train.lr, train.betas, train.weight_decay)",
    "optimizer.params.lr": "train.lr",
    "optimizer.params.betas": "train.betas",
    "optimizer.params.weight_decay": "train.weight_decay",
    "scheduler": "d3ray's LR schedule (train.lr, train.warmup_steps, train.min_lr_ratio)",
    "zero_optimization.stage": "train.zero_stage",
    "zero_optimization.stage3_gather_16bit_weights_on_model_save": "d3ray's ZeRO-3 weight snapshots (always true)",
    "bf16.enabled": "train.precision",
    "fp16.enabled": "train.precision (bf16 or fp32; fp16 is not supported)",
    "activation_checkpointing": "train.activation_checkpointing",
}


def merge_deepspeed_overrides(generated: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``overrides`` (``train.deepspeed``) merged into a copy of ``generated``, key by key (nested
    mappings merge, anything else replaces); ``"auto"`` leaves the generated value (or DeepSpeed's
    default) in place.

    Raises:
        ValueError: a key of ``OWNED`` with a value other than the generated one, naming the key, both
            values and the typed field to set instead.
    """
    merged = copy.deepcopy(generated)

    def merge(into: dict[str, Any], extra: dict[str, Any], prefix: str) -> None:
        for key, value in extra.items():
            path = f"{prefix}{key}"
            if value == "auto":
                continue
            if path in OWNED:
                have = into.get(key)
                if not _same(value, have):
                    raise ValueError(
                        f"train.deepspeed.{path}={value!r} conflicts with {OWNED[path]}"
                        f"{'' if have is None else f' (= {have!r})'}: set the typed field instead and drop the key "
                        f"from train.deepspeed")
                continue
            if isinstance(value, dict) and isinstance(into.get(key), dict):
                merge(into[key], value, f"{path}.")
            elif isinstance(value, dict):
                into[key] = {}
                merge(into[key], value, f"{path}.")
            else:
                into[key] = copy.deepcopy(value)

    merge(merged, overrides, "")
    return merged


def check_deepspeed_fragment(cfg: TrainConfig) -> None:
    """``train.deepspeed``'s ``zero_optimization`` keys checked by DeepSpeed's own schema (a misspelt
    ``offload_optimiser``, ``device: gpu``) in the driver, before Ray starts; imports DeepSpeed only
    when the fragment has such keys.

    Raises:
        UserError: one line naming the key, DeepSpeed's complaint and the fix.
    """
    if "zero_optimization" not in cfg.deepspeed:
        return
    from d3ray.deepspeed_import import import_deepspeed

    import_deepspeed()  # first, without the MLflow import of its autotuner (d3ray/deepspeed_import.py)
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    try:
        DeepSpeedZeroConfig(**deepspeed_config(cfg)["zero_optimization"])
    except ValueError as err:  # pydantic's ValidationError
        errors = getattr(err, "errors", None)
        first = errors()[0] if errors else {"loc": (), "msg": str(err).splitlines()[0]}
        where = ".".join(str(x) for x in first["loc"])
        raise UserError(f"train.deepspeed.zero_optimization.{where}: {first['msg']} (DeepSpeed's ZeRO config, "
                        f"got {first.get('input')!r}); fix or drop the key") from err


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    return a == b


def deepspeed_config(cfg: TrainConfig) -> dict[str, Any]:
    """DeepSpeed engine config for ``cfg`` (batch sizes, ZeRO stage, optimizer, precision), with
    ``cfg.deepspeed`` merged over it (:func:`merge_deepspeed_overrides`)."""
    zero: dict[str, Any] = {"stage": cfg.zero_stage}
    if cfg.zero_stage == 3:
        # Snapshots for the influence actors gather the 16-bit weights on rank 0.
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    generated = {
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
    return merge_deepspeed_overrides(generated, cfg.deepspeed) if cfg.deepspeed else generated


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Linear warmup to 1, then cosine decay to ``min_lr_ratio`` at ``cfg.steps``."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    span = max(1, cfg.steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * cosine
