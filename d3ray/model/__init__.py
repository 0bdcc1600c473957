"""The model: which causal LM a run trains and scores influence with, built the same way everywhere.

- :mod:`d3ray.model.causal_lm`: architecture presets, ``ModelConfig``, the transformers config dict that
  travels to Ray actors, and the builder (random init, a local pretrained directory, ZeRO-3 partitioned);
  its public names are this package's (``from d3ray.model import ModelConfig, build_model``).
- :mod:`d3ray.model.lora`: LoRA adapters through ``peft``.
- :mod:`d3ray.model.lm_loss`: the per-sequence causal-LM losses and the (weighted) step loss.

The package imports no torch at import time (the run config imports ``ModelConfig``); the builder, LoRA
and the losses import torch, transformers and peft when they are called or imported.
"""

from d3ray.model.causal_lm import (
    PRESETS,
    ModelConfig,
    build_model,
    check_pretrained_path,
    check_tokenizer_fits,
    enable_activation_checkpointing,
    lora_base_model,
    model_config_dict,
)

__all__ = ["PRESETS", "ModelConfig", "build_model", "check_pretrained_path", "check_tokenizer_fits", "lora_base_model",
           "enable_activation_checkpointing", "model_config_dict"]
