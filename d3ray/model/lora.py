"""LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models") through ``peft``.

``apply_lora`` wraps a transformers causal LM in a ``peft`` model whose only trainable parameters
are the low-rank factors A (r × d_in) and B (d_out × r) of the targeted linear layers; the layer
computes ``W x + (alpha / r) · B A x`` with B = 0 at the start, so the wrapped model starts with
exactly the base model's outputs. The DeepSpeed engine is then built on the trainable parameters
only, and influence sketches / LESS features over ``requires_grad`` parameters cover only A and B
(how LESS is used in practice, and much cheaper). A checkpoint records the adapter config in
``model.json`` (``checkpoint.describe_model``); ``d3ray export`` merges or saves the adapter, and
:func:`lora_from_description` rebuilds the wrapped model from that description.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

# Default targets: every linear layer but the output head (peft's ``all-linear``: nn.Linear and GPT-2's
# Conv1D), on any architecture (GPT-2, Llama, Qwen2, Mistral, ...). QLoRA found adapting every
# projection to match full fine-tuning far better than peft's old default of query/value only.
DEFAULT_TARGETS = "all-linear"


@dataclass(frozen=True, kw_only=True)
class LoraConfig:
    """Low-rank adapters instead of full fine-tuning."""

    r: int = 8
    """Rank of each adapter."""
    alpha: float = 16.0
    """Scale numerator: the update is (alpha / r) · B A."""
    dropout: float = 0.0
    """Dropout on the adapter's input."""
    target_modules: list[str] = field(default_factory=list)
    """Module names to adapt; empty = every linear layer but the LM head (peft's ``all-linear``)."""

    def __post_init__(self) -> None:
        if self.r < 1:
            raise ValueError(f"lora.r must be >= 1, got {self.r}")
        if self.alpha <= 0:
            raise ValueError(f"lora.alpha must be > 0, got {self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"lora.dropout must be in [0, 1), got {self.dropout}")


def apply_lora(model: Any, cfg: LoraConfig) -> Any:
    """Wrap a causal LM in a peft LoRA model; only the adapters require grad afterwards.

    Targets: ``cfg.target_modules``, or every linear layer but the LM head (``DEFAULT_TARGETS``).
    """
    import peft

    model_type = model.config.model_type
    targets = list(cfg.target_modules) or DEFAULT_TARGETS
    peft_cfg = peft.LoraConfig(
        task_type="CAUSAL_LM",
        r=cfg.r,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=targets,
        fan_in_fan_out=model_type == "gpt2",  # GPT-2's Conv1D stores weights as (in, out)
    )
    return peft.get_peft_model(model, peft_cfg)


def lora_from_description(model: Any, lora: dict[str, Any]) -> Any:
    """Wrap ``model`` with the adapter described in a checkpoint's ``model.json`` (weights not loaded)."""
    import peft

    known = {f.name for f in dataclasses.fields(peft.LoraConfig) if f.init}
    kwargs = {k: v for k, v in lora.items() if k in known and k not in ("peft_type", "auto_mapping")}
    return peft.get_peft_model(model, peft.LoraConfig(**kwargs))
