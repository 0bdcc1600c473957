"""Export: d3ray checkpoints (DeepSpeed ZeRO 0-3, full or LoRA) → Hugging Face model directories.

See README.md in this folder. ``load_model`` is also how ``d3ray eval`` opens a model.
"""

from __future__ import annotations

from d3ray.export.load import (
    LoadedModel,
    deepspeed_state_dict,
    load_checkpoint_model,
    load_model,
    model_source_kind,
    resolve_model_source,
)
from d3ray.export.write import LORA_MODES, export_model

__all__ = [
    "LORA_MODES",
    "LoadedModel",
    "deepspeed_state_dict",
    "export_model",
    "load_checkpoint_model",
    "load_model",
    "model_source_kind",
    "resolve_model_source",
]
