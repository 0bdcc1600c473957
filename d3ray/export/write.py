"""Write a Hugging Face model directory (safetensors, config, tokenizer) from any loadable source.

    merged (default)   out/  config.json, model.safetensors, generation_config.json, tokenizer files
                       (a LoRA model is merged first: W ← W + (alpha / r) · B A, then unwrapped)
    adapter            out/  adapter_config.json, adapter_model.safetensors, tokenizer files
                       out/base/  the base model (a full HF dir), named by the adapter config

``AutoModelForCausalLM.from_pretrained(out)`` loads either layout (transformers loads an adapter
dir through peft, from ``base_model_name_or_path``, which is written as the absolute path of
``out/base``; after moving the folder, load ``out/base`` and then the adapter with
``peft.PeftModel.from_pretrained``).

The weights are written in fp32 (default) or bf16 (``--dtype``). Every export holds
``d3ray_export.json`` (source, kind, LoRA mode, dtype). An existing ``out`` is replaced only
when it is empty or holds that file (a previous export); any other directory is refused, never wiped.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from d3ray.data.tokenizer import save_tokenizer
from d3ray.export.load import LoadedModel, load_model, resolve_model_source
from d3ray.run_files import atomic_directory, refuse_foreign_directory

logger = logging.getLogger(__name__)

LORA_MODES = ("merged", "adapter")
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
"""``--dtype`` → the torch dtype the weights are written in (config.json's ``dtype`` follows)."""
EXPORT_MARKER = "d3ray_export.json"
"""Written into every export: what it was exported from (and that d3ray may replace the folder)."""


def export_model(source: str | Path, out_dir: str | Path, lora: str = "merged", dtype: str = "fp32") -> Path:
    """Export ``source`` (d3ray checkpoint, HF dir or adapter dir) as a HF model directory.

    The directory is written next to ``out_dir`` first and renamed, so a failed export never
    leaves a half-written model where a loader would find it.

    Args:
        source: what :func:`~d3ray.export.load.load_model` accepts.
        out_dir: the directory to write: new, empty, or a previous export (which it replaces).
        lora: ``merged`` or ``adapter``; ignored (with a log line) for a model without LoRA.
        dtype: ``fp32`` (the trainers' master weights as they are) or ``bf16`` (half the bytes; each
            weight rounded once, after a LoRA merge in fp32).

    Returns:
        ``out_dir``.

    Raises:
        UserError: ``out_dir`` is a file or a non-empty directory that is not a previous export
            (checked before the model is loaded).
    """
    if lora not in LORA_MODES:
        raise ValueError(f"lora must be one of {list(LORA_MODES)}, got {lora!r}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {list(DTYPES)}, got {dtype!r}")
    out = Path(out_dir).resolve()
    refuse_foreign_directory(out, EXPORT_MARKER, "--out")
    resolved = resolve_model_source(source)
    loaded = load_model(resolved)
    with atomic_directory(out, owned_marker=EXPORT_MARKER) as tmp:
        write_loaded(loaded, tmp, lora, final_dir=out, dtype=dtype)
        record = {"source": str(Path(resolved).resolve()), "kind": loaded.kind, "lora": lora if loaded.is_lora else None,
                  "dtype": dtype}
        (tmp / EXPORT_MARKER).write_text(json.dumps(record, indent=2) + "\n")
    logger.info("exported %s (%s%s) to %s", source, loaded.kind, ", LoRA " + lora if loaded.is_lora else "", out)
    return out


def write_loaded(loaded: LoadedModel, out: Path, lora: str, final_dir: Path, dtype: str = "fp32") -> None:
    """Write ``loaded`` into ``out`` (``final_dir`` is where it will live, for the adapter's base path), its
    weights in ``dtype`` (a key of ``DTYPES``)."""
    import torch

    torch_dtype = getattr(torch, DTYPES[dtype])
    model = loaded.model
    if loaded.is_lora and lora == "adapter":
        model.to(torch_dtype).save_pretrained(str(out))
        base = model.unload()  # the base model without the adapter layers, weights untouched
        base.save_pretrained(str(out / "base"))
        save_tokenizer(loaded.tokenizer, out / "base")
        config_file = out / "adapter_config.json"
        config = json.loads(config_file.read_text())
        config["base_model_name_or_path"] = str(final_dir / "base")
        config_file.write_text(json.dumps(config, indent=2) + "\n")
    else:
        if loaded.is_lora:
            model = model.merge_and_unload()
        elif lora == "adapter":
            logger.info("the model has no LoRA adapter: writing the full model")
        model.to(torch_dtype).save_pretrained(str(out))
    save_tokenizer(loaded.tokenizer, out)
