"""Causal LMs: architecture presets, their transformers config dicts, and the model builder.

A low-level module (imports only ``d3ray.model.lora`` and ``d3ray.errors``) shared by the trainers
(``d3ray.train``), the influence workers (``d3ray.influence``) and the benchmarks, so that all of them build
the same architecture from the same preset. Presets span a 2-core CPU smoke model to GPU-sized models; ``model_config_dict``
gives the plain transformers config dict (with ``model_type``) that travels to Ray actors, and
``build_model`` makes the model from it (random init, or a local pretrained directory; any local HF
causal LM: GPT-2, Llama, Qwen2, Mistral shapes are tested). Given a ZeRO-3 DeepSpeed config it builds
the model partitioned (transformers' ``HfDeepSpeedConfig`` makes ``from_config`` / ``from_pretrained``
construct it inside ``deepspeed.zero.Init``): each rank holds its shard, never the whole model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from d3ray.errors import UserError
from d3ray.model.lora import LoraConfig

__all__ = ["PRESETS", "ModelConfig", "build_model", "check_pretrained_path", "check_tokenizer_fits", "lora_base_model",
           "enable_activation_checkpointing", "model_config_dict"]

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
    """A local Hugging Face causal LM directory (config.json + weights) to start from instead of random init
    (no hub downloads). Its tokenizer comes with it: unless ``data.tokenizer.path`` is set, the run uses
    the tokenizer files in this directory (read only); a tokenizer larger than the model's vocabulary is
    refused."""
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


def check_pretrained_path(cfg: ModelConfig) -> None:
    """``model.pretrained_path`` names a local model directory (``config.json``), else one line.

    Raises:
        UserError: the path is missing, not a directory, or holds no ``config.json``.
    """
    if cfg.pretrained_path is None:
        return
    root = Path(cfg.pretrained_path)
    if not root.is_dir():
        raise UserError(f"model.pretrained_path={cfg.pretrained_path}: no such directory; point it at a local Hugging "
                        "Face model directory (config.json + weights), nothing is downloaded")
    if not (root / "config.json").is_file():
        raise UserError(f"model.pretrained_path={cfg.pretrained_path}: holds no config.json; point it at a local "
                        "Hugging Face model directory (config.json + model.safetensors)")


def check_tokenizer_fits(config_dict: dict[str, Any], tokenizer_size: int, cfg: ModelConfig,
                         tokenizer_field: str, tokenizer_path: str) -> None:
    """A pretrained model's embedding must have a row for every token of the run's tokenizer.

    A tokenizer smaller than the vocabulary is fine (models pad their vocabulary); a larger one would
    index past the embedding on its first unseen token.

    Raises:
        UserError: ``tokenizer_size`` > the model's ``vocab_size``, naming both sizes and both fields.
    """
    if cfg.pretrained_path is None:
        return
    vocab = int(config_dict["vocab_size"])
    if tokenizer_size > vocab:
        raise UserError(
            f"{tokenizer_field}={tokenizer_path} has {tokenizer_size} tokens but model.pretrained_path="
            f"{cfg.pretrained_path} has vocab_size {vocab}: use the model's own tokenizer (leave data.tokenizer.path "
            f"unset to load it from model.pretrained_path) or a tokenizer of at most {vocab} tokens")


def build_model(config_dict: dict[str, Any], cfg: ModelConfig, deepspeed_config: dict[str, Any] | None = None) -> Any:
    """A ``transformers`` causal LM (train mode): pretrained weights if configured, else random init;
    wrapped in LoRA adapters (peft) when ``cfg.lora`` is set, so that only the adapters require grad.

    Under ZeRO-3 (``deepspeed_config`` with ``zero_optimization.stage`` 3, in a process whose
    ``torch.distributed`` group is up) the model is built partitioned: transformers constructs it inside
    ``deepspeed.zero.Init`` while an ``HfDeepSpeedConfig`` is alive (random init: rank 0's values,
    broadcast; pretrained: each tensor loaded and partitioned in turn), so no rank ever holds the whole
    model. The ``HfDeepSpeedConfig`` lives only for the construction: kept alive, it would make
    ``generate`` synchronise every rank (``synced_gpus``), which rank-0-only evaluation cannot join.

    Args:
        config_dict: the transformers config dict from :func:`model_config_dict`.
        cfg: where the weights come from (``pretrained_path``), the adapters and the attention kernel.
        deepspeed_config: the DeepSpeed engine config the model is for (``None``: a plain model).
    """
    import torch.distributed as dist
    import transformers

    hf_config = transformers.AutoConfig.for_model(**config_dict)
    zero3 = deepspeed_config is not None and deepspeed_config.get("zero_optimization", {}).get("stage") == 3
    if zero3 and not dist.is_initialized():
        raise RuntimeError("build_model under ZeRO-3 builds the model partitioned: it needs the trainers' "
                           "torch.distributed process group (deepspeed.init_distributed) first")
    if zero3:
        from transformers.integrations import HfDeepSpeedConfig

        partitioned = HfDeepSpeedConfig(deepspeed_config)  # noqa: F841  (alive = transformers uses zero.Init)
    try:
        if cfg.pretrained_path is not None:
            model = transformers.AutoModelForCausalLM.from_pretrained(
                cfg.pretrained_path, config=hf_config, local_files_only=True,
                attn_implementation=cfg.attn_implementation,
            )
        else:
            model = transformers.AutoModelForCausalLM.from_config(hf_config,
                                                                  attn_implementation=cfg.attn_implementation)
    finally:
        if zero3:
            from transformers.integrations.deepspeed import unset_hf_deepspeed_config

            unset_hf_deepspeed_config()
    return apply_lora_if_set(model, cfg)


def enable_activation_checkpointing(model: Any) -> None:
    """Recompute each decoder layer's activations in the backward (``train.activation_checkpointing``),
    non-reentrant: frozen inputs (LoRA) need no ``requires_grad`` trick, and the loss and gradients are
    those of the plain model. transformers 5 names it ``activation_checkpointing_enable``, 4.x
    ``gradient_checkpointing_enable``."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def lora_base_model(cfg: ModelConfig) -> str | None:
    """The local directory the frozen base of a LoRA run is read from, as an absolute path; None when
    every weight trains or the base is randomly initialised (its checkpoints then keep the base,
    since nothing on disk could rebuild it)."""
    if cfg.lora is None or cfg.pretrained_path is None:
        return None
    return str(Path(cfg.pretrained_path).expanduser().resolve())


def apply_lora_if_set(model: Any, cfg: ModelConfig) -> Any:
    if cfg.lora is not None:
        from d3ray.model.lora import apply_lora

        model = apply_lora(model, cfg.lora)
    return model
