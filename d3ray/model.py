"""Causal LMs: architecture presets, their transformers config dicts, and the model builder.

A low-level module (imports only ``d3ray.lora``) shared by the trainers (``d3ray.train``), the influence
workers (``d3ray.influence``) and the benchmarks, so that all of them build the same architecture from
the same preset. Presets span a 2-core CPU smoke model to GPU-sized models; ``model_config_dict``
gives the plain transformers config dict (with ``model_type``) that travels to Ray actors, and
``build_model`` makes the model from it (random init, or a local pretrained directory).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from d3ray.lora import LoraConfig

__all__ = ["PRESETS", "ModelConfig", "build_model", "model_config_dict"]

# name -> (model_type, transformers config fields). Context length and vocab are set per run.
PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "gpt2-tiny": ("gpt2", {"n_layer": 2, "n_head": 2, "n_embd": 64}),
    "gpt2-small": ("gpt2", {"n_layer": 4, "n_head": 4, "n_embd": 256}),
    "gpt2-124m": ("gpt2", {"n_layer": 12, "n_head": 12, "n_embd": 768}),
    "llama-tiny": (
        "llama",
        {"num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
         "hidden_size": 64, "intermediate_size": 172},
    ),
    "llama-1b": (
        "llama",
        {"num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
         "hidden_size": 2048, "intermediate_size": 8192, "tie_word_embeddings": True},
    ),
}


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Which causal LM to train (and to score influence with)."""

    preset: str = "gpt2-tiny"
    """Architecture preset (see ``PRESETS``): gpt2-tiny, gpt2-small, gpt2-124m, llama-tiny, llama-1b."""
    pretrained_path: str | None = None
    """A local Hugging Face model directory to start from instead of random init (no hub downloads)."""
    overrides: dict[str, int | float | str | bool] = field(default_factory=dict)
    """Extra transformers config fields, e.g. ``{n_layer: 4}``; applied over the preset."""
    lora: LoraConfig | None = None
    """Low-rank adapters (peft) instead of full fine-tuning: only the adapters train, and every
    process that rebuilds the model (influence and scoring actors, export) builds the same adapters."""
    attn_implementation: str = "eager"
    """Attention kernel for training: eager (works everywhere, needed for double backward on CPU),
    sdpa, or flash_attention_2 on GPUs."""

    def __post_init__(self) -> None:
        if self.pretrained_path is None and self.preset not in PRESETS:
            raise ValueError(f"model.preset={self.preset!r} is not one of {sorted(PRESETS)}")
        if self.attn_implementation not in ("eager", "sdpa", "flash_attention_2"):
            raise ValueError(
                f"model.attn_implementation={self.attn_implementation!r} is not eager/sdpa/flash_attention_2"
            )


def model_config_dict(cfg: ModelConfig, vocab_size: int, seq_len: int, eos_id: int) -> dict[str, Any]:
    """The transformers config (as a plain dict with ``model_type``) for this run's model."""
    import transformers

    if cfg.pretrained_path is not None:
        hf = transformers.AutoConfig.from_pretrained(cfg.pretrained_path, local_files_only=True)
        out = hf.to_dict()
        out.update(cfg.overrides)
        return out
    model_type, fields = PRESETS[cfg.preset]
    fields = dict(fields)
    if model_type == "gpt2":
        fields.update(n_positions=seq_len, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    else:
        fields.update(max_position_embeddings=seq_len)
    fields.update(vocab_size=vocab_size, bos_token_id=eos_id, eos_token_id=eos_id)
    fields.update(cfg.overrides)
    hf = transformers.AutoConfig.for_model(model_type, **fields)
    return hf.to_dict()


def build_model(config_dict: dict[str, Any], cfg: ModelConfig) -> Any:
    """A ``transformers`` causal LM (train mode): pretrained weights if configured, else random init;
    wrapped in LoRA adapters (peft) when ``cfg.lora`` is set, so that only the adapters require grad.

    Args:
        config_dict: the transformers config dict from :func:`model_config_dict`.
        cfg: where the weights come from (``pretrained_path``), the adapters and the attention kernel.
    """
    import transformers

    hf_config = transformers.AutoConfig.for_model(**config_dict)
    if cfg.pretrained_path is not None:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            cfg.pretrained_path, config=hf_config, local_files_only=True,
            attn_implementation=cfg.attn_implementation,
        )
    else:
        model = transformers.AutoModelForCausalLM.from_config(hf_config, attn_implementation=cfg.attn_implementation)
    if cfg.lora is not None:
        from d3ray.lora import apply_lora

        model = apply_lora(model, cfg.lora)
    return model
