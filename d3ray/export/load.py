"""Load a model for export or evaluation: a d3ray checkpoint, a local HF model dir, or a LoRA adapter dir.

    d3ray checkpoint dir (train/checkpoint.py)          model.json ─► architecture (+ LoRA config)
      deepspeed/ds/*zero_pp_rank_*optim_states.pt  ──► DeepSpeed zero_to_fp32 (ZeRO 1-3: fp32 master
                                                        weights gathered from every rank's shard)
      deepspeed/ds/mp_rank_00_model_states.pt      ──► its "module" state dict (ZeRO 0)
      tokenizer/                                   ──► the run's tokenizer
    HF model dir (config.json)                     ──► AutoModelForCausalLM.from_pretrained (local only)
    adapter dir (adapter_config.json)              ──► base from base_model_name_or_path + the adapter
    run dir (runs/<name>/checkpoint_*/)            ──► the checkpoint its ``latest`` pointer names (else the
                                                        highest step in state.json)
    LoRA checkpoint whose model.json names a base  ──► the base from that local directory + the adapters

Nothing is downloaded: every ``from_pretrained`` is ``local_files_only``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from d3ray.errors import DataPathError
from d3ray.run_files import read_latest

logger = logging.getLogger(__name__)

DS_SUBDIR = "deepspeed"


@dataclass
class LoadedModel:
    """A causal LM (possibly a peft LoRA model) with its tokenizer and where it came from."""

    model: Any
    tokenizer: Any
    kind: str
    """``checkpoint``, ``hf`` or ``adapter``."""

    @property
    def is_lora(self) -> bool:
        return hasattr(self.model, "peft_config")


def resolve_model_source(path: str | Path) -> Path:
    """``path`` itself, or, for a run directory (``runs/<name>``, holding ``checkpoint_*/``), its newest
    checkpoint: the one its ``latest`` pointer names (``train/latest.py``), else the one of the highest
    step (``state.json``), logged. Ray Train names checkpoints ``checkpoint_<timestamp>``, so a run
    directory is the name a user can type.

    Raises:
        DataPathError: ``path`` does not exist, or is a run directory without a checkpoint yet.
    """
    root = Path(path)
    if not root.exists():
        raise DataPathError(f"{path}: no such checkpoint, run directory or model directory")
    if not root.is_dir() or any((root / f).is_file() for f in ("model.json", "config.json", "adapter_config.json")):
        return root
    pointed = read_latest(root)
    if pointed is not None and model_source_kind(pointed) == "checkpoint":
        logger.info("%s is a run directory: using the checkpoint its latest pointer names, %s", path, pointed)
        return pointed
    checkpoints = [c for c in root.glob("checkpoint_*") if (c / "model.json").is_file() and (c / DS_SUBDIR).is_dir()]
    if not checkpoints:
        if (root / "config.yaml").is_file():
            raise DataPathError(f"{path}: a run directory without a checkpoint yet (no checkpoint_*/ with model.json); "
                                "train it further, or pass a checkpoint or model directory")
        return root  # model_source_kind names what each kind of source needs
    newest = max(checkpoints, key=lambda c: (_checkpoint_step(c), c.name))
    logger.info("%s is a run directory: using its newest checkpoint %s (step %d)", path, newest, _checkpoint_step(newest))
    return newest


def _checkpoint_step(checkpoint: Path) -> int:
    state = checkpoint / "state.json"
    return int(json.loads(state.read_text()).get("step", -1)) if state.is_file() else -1


def model_source_kind(path: str | Path) -> str:
    """``checkpoint``, ``adapter`` or ``hf``, from the files in ``path``.

    Raises:
        FileNotFoundError: ``path`` is none of them (the message lists what each needs).
    """
    root = Path(path)
    if (root / "model.json").is_file() and (root / DS_SUBDIR).is_dir():
        return "checkpoint"
    if (root / "adapter_config.json").is_file():
        return "adapter"
    if (root / "config.json").is_file():
        return "hf"
    raise DataPathError(
        f"{path}: not a d3ray checkpoint (model.json + deepspeed/), a run directory (checkpoint_*/), a LoRA "
        "adapter dir (adapter_config.json) or a Hugging Face model dir (config.json)"
    )


def load_model(path: str | Path, attn_implementation: str = "eager") -> LoadedModel:
    """Load a model and its tokenizer from any of the three sources (or a run directory's newest
    checkpoint), in eval mode, fp32 on the CPU."""
    path = resolve_model_source(path)
    kind = model_source_kind(path)
    if kind == "checkpoint":
        loaded = load_checkpoint_model(path, attn_implementation)
    else:
        import transformers

        from d3ray.data.tokenizer import load_tokenizer

        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(path), local_files_only=True, attn_implementation=attn_implementation
        )
        loaded = LoadedModel(model=model, tokenizer=load_tokenizer(path), kind=kind)
    loaded.model.eval()
    return loaded


def load_checkpoint_model(ckpt_dir: str | Path, attn_implementation: str = "eager") -> LoadedModel:
    """Rebuild the model of a d3ray checkpoint from ``model.json`` and load its DeepSpeed weights.

    Raises:
        FileNotFoundError: no ``model.json`` / ``tokenizer/`` / DeepSpeed state in ``ckpt_dir``.
        ValueError: the weights do not match the architecture (missing or unexpected names).
    """
    import transformers

    from d3ray.data.tokenizer import load_tokenizer
    from d3ray.model.lora import lora_from_description

    root = Path(ckpt_dir)
    description_file = root / "model.json"
    if not description_file.is_file():
        raise FileNotFoundError(f"{root}: no model.json (written by d3ray.train.checkpoint.save_checkpoint)")
    description = json.loads(description_file.read_text())
    config = transformers.AutoConfig.for_model(**description["config"])
    base = description.get("base_model")
    if base is None:
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation)
    else:  # LoRA without its frozen base: the base comes from the directory it was trained on
        if not (Path(base) / "config.json").is_file():
            raise DataPathError(f"{root} holds LoRA adapters only; their base model {base} (the run's "
                                "model.pretrained_path) is gone: restore it there to load this checkpoint")
        model = transformers.AutoModelForCausalLM.from_pretrained(
            base, config=config, local_files_only=True, attn_implementation=attn_implementation)
    if description.get("lora"):
        model = lora_from_description(model, description["lora"])
    state = deepspeed_state_dict(root / DS_SUBDIR)
    load_exact_state_dict(model, state, where=str(root), frozen_from_base=base is not None)
    if not (root / "tokenizer").is_dir():
        raise FileNotFoundError(f"{root}: no tokenizer/ folder; the checkpoint was saved without one")
    return LoadedModel(model=model, tokenizer=load_tokenizer(root / "tokenizer"), kind="checkpoint")


def deepspeed_state_dict(ds_dir: str | Path, tag: str | None = None) -> dict[str, Any]:
    """The full fp32 state dict of a DeepSpeed checkpoint folder (``engine.save_checkpoint(ds_dir)``).

    ZeRO 1-3 (optimizer shards present): DeepSpeed's own ``zero_to_fp32`` merges every rank's
    fp32 master partitions (and frozen parameters, e.g. a LoRA base model). ZeRO 0: the
    ``module`` state dict of the model-states file, read as data only (:mod:`d3ray.safe_load`); the ZeRO
    shards are DeepSpeed's to unpickle (README, Security).
    """
    from d3ray.deepspeed_import import import_deepspeed
    from d3ray.safe_load import load_data

    import_deepspeed()  # first, without the MLflow import of its autotuner (d3ray/deepspeed_import.py)
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    ds_dir = Path(ds_dir)
    if tag is None:
        latest = ds_dir / "latest"
        if not latest.is_file():
            raise FileNotFoundError(f"{ds_dir}: no 'latest' file naming the DeepSpeed checkpoint tag")
        tag = latest.read_text().strip()
    folder = ds_dir / tag
    if any(folder.glob("*zero_pp_rank_*optim_states.pt")):
        return get_fp32_state_dict_from_zero_checkpoint(str(ds_dir), tag=tag)
    model_states = folder / "mp_rank_00_model_states.pt"
    if not model_states.is_file():
        raise FileNotFoundError(f"{folder}: neither ZeRO optimizer shards nor mp_rank_00_model_states.pt")
    return {k: v.float() for k, v in load_data(model_states, map_location="cpu")["module"].items()}


def load_exact_state_dict(model: Any, state: dict[str, Any], where: str, frozen_from_base: bool = False) -> None:
    """Load ``state`` into ``model``; every parameter must come from it, or be tied to one that does.

    DeepSpeed stores a tied weight once (GPT-2's ``lm_head.weight`` is ``wte.weight``), so a name
    may be missing when its tensor is shared with a loaded one; with ``frozen_from_base`` (a LoRA
    checkpoint without its base) the frozen parameters are missing too, and every trainable one must
    be there. Anything else is an error.
    """
    missing, unexpected = model.load_state_dict(state, strict=False)
    own = model.state_dict()
    loaded_ptrs = {own[k].data_ptr() for k in state if k in own}
    if frozen_from_base:  # a frozen tensor under any of its names (GPT-2's lm_head.weight is the frozen wte)
        loaded_ptrs |= {p.data_ptr() for p in model.parameters() if not p.requires_grad}
    untied = [k for k in missing if own[k].data_ptr() not in loaded_ptrs]
    if untied or unexpected:
        raise ValueError(
            f"{where}: the weights do not match the architecture in model.json: "
            f"missing {untied[:5]}{'...' if len(untied) > 5 else ''}, unexpected {list(unexpected)[:5]}"
        )
