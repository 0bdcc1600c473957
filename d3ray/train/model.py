"""Causal LMs built from transformers configs (random init) or a local pretrained directory.

Presets span a 2-core CPU smoke model to GPU-sized models. ``model_config_dict`` gives the
plain transformers config dict that influence actors use to build the same architecture.
"""

from __future__ import annotations

from typing import Any

from d3ray.train.config import ModelConfig

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


def build_model(config_dict: dict[str, Any], cfg: ModelConfig):
    """A ``transformers`` causal LM: pretrained weights if configured, else random init; wrapped in
    LoRA adapters (peft) when ``cfg.lora`` is set, so that only the adapters require grad."""
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
        from d3ray.train.lora import apply_lora

        model = apply_lora(model, cfg.lora)
    return model

