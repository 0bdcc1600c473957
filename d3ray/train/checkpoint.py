"""Checkpoints: DeepSpeed engine state + data cursor + RNG + schedule log + tokenizer.

Layout of one checkpoint directory (Ray Train merges the per-rank directories into one):

    deepspeed/           engine.save_checkpoint (model, optimizer, LR schedule; ZeRO shards per rank)
    state.json           TrainState: step, data cursor (chunk id, position), tokens, schedule state
                         (the coordinator's ``checkpoint_state``: next decisions, scheduler state)
    model.json           the transformers config of the model (and the peft LoRA config, if any), so
                         that ``d3ray export`` / ``d3ray eval`` can rebuild it from the checkpoint alone;
                         ``base_model``: for LoRA on ``model.pretrained_path``, the frozen base is not
                         in ``deepspeed/`` (only the adapters and their optimizer state are) and is
                         read back from this local model directory
    rng_rank<r>.pt       torch / numpy / python RNG state of rank r
    tokenizer/           the run's tokenizer (so a checkpoint is self-contained)
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from d3ray.safe_load import load_data

DS_TAG = "ds"


@dataclass
class TrainState:
    """Where training stands: the data cursor is ``(next_chunk, position)`` in the ordered stream.

    ``position`` > 0 only when the run ended inside a chunk (``train.steps`` reached).
    """

    step: int = 0
    next_chunk: int = 0
    position: int = 0
    tokens: int = 0
    schedule: dict[str, Any] = field(default_factory=dict)


def checkpoint_due(*, finished: bool, chunk_done: bool, next_chunk: int, every_chunks: int,
                   seconds_since_last: float, every_sec: float, step: int = 0, last_checkpoint_step: int = 0,
                   every_steps: int = 0) -> bool:
    """Whether the trainers write a checkpoint now: at the end of the run, and otherwise only at a
    chunk boundary (the data cursor is then ``(next_chunk, 0)`` and the schedule state is the
    coordinator's at ``next_chunk``), when

    - ``every_steps`` > 0: the chunk crossed a multiple of ``every_steps`` (it replaces the chunk cadence);
    - else ``next_chunk`` is a multiple of ``every_chunks`` (counted from the start of the run, so a
      resumed run keeps the same cadence);
    - or ``every_sec`` > 0 seconds have passed since the last checkpoint.

    A run killed between checkpoints resumes from the last one and trains the chunks after it again:
    each sample is trained exactly once in the final model."""
    if finished:
        return True
    if not chunk_done:
        return False
    if every_sec > 0 and seconds_since_last >= every_sec:
        return True
    if every_steps > 0:  # the chunk (schedule.L steps) crossed a multiple of every_steps
        return step // every_steps > last_checkpoint_step // every_steps
    return next_chunk % every_chunks == 0


def save_checkpoint(engine, state: TrainState, directory: Path, rank: int, tokenizer_dir: Path | None,
                    base_model: str | None = None) -> None:
    """Write this rank's part of a checkpoint into ``directory`` (a collective: every rank calls).

    ``base_model``: the local directory the frozen base weights came from (LoRA on
    ``model.pretrained_path``). The checkpoint then leaves every frozen parameter out (DeepSpeed's
    ``exclude_frozen_parameters``): a 7B base with rank-16 adapters checkpoints tens of MB, not 14 GB.
    """
    directory = Path(directory)
    engine.save_checkpoint(str(directory / "deepspeed"), tag=DS_TAG, exclude_frozen_parameters=base_model is not None)
    torch.save(
        {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()},
        directory / f"rng_rank{rank}.pt",
    )
    if rank == 0:
        (directory / "state.json").write_text(json.dumps(asdict(state)))
        description = {**describe_model(engine.module), "base_model": base_model}
        (directory / "model.json").write_text(json.dumps(description, indent=2))
        if tokenizer_dir is not None:
            shutil.copytree(tokenizer_dir, directory / "tokenizer", dirs_exist_ok=True)


def describe_model(module) -> dict:
    """``{"config": transformers config dict, "lora": peft LoRA config dict or None}`` of a model.

    A peft model (LoRA) is described by its base model's config plus its adapter config; every
    set in the adapter config (``target_modules``) becomes a sorted list, so the dict is JSON.
    """
    lora = None
    if hasattr(module, "peft_config") and hasattr(module, "get_base_model"):
        raw = module.peft_config["default"].to_dict()
        lora = {k: sorted(v) if isinstance(v, set) else v for k, v in raw.items()}
        module = module.get_base_model()
    return {"config": json.loads(module.config.to_json_string(use_diff=False)), "lora": lora}


def load_checkpoint(engine, directory: Path, rank: int, base_model: str | None = None) -> TrainState:
    """Restore engine, RNG and cursor from ``directory`` (every rank calls). A checkpoint without its
    frozen base (``model.json`` names a ``base_model``) loads non-strictly: the engine's frozen weights
    are the base's, loaded by ``build_model`` from ``base_model``, which must be the directory the
    checkpoint names."""
    directory = Path(directory)
    description = json.loads((directory / "model.json").read_text()) if (directory / "model.json").is_file() else {}
    if description.get("base_model") not in (None, base_model):
        raise ValueError(f"{directory} holds LoRA adapters trained on the base model {description['base_model']}, "
                         f"but this run's model.pretrained_path is {base_model}: resume with the same base")
    path, _ = engine.load_checkpoint(str(directory / "deepspeed"), tag=DS_TAG,
                                     load_module_strict=description.get("base_model") is None)
    if path is None:
        raise RuntimeError(f"DeepSpeed found no checkpoint under {directory / 'deepspeed'}")
    rng_file = directory / f"rng_rank{rank}.pt"
    if rng_file.exists():
        rng = load_data(rng_file)  # weights only: NumPy arrays allowed, no code run (d3ray/safe_load.py)
        torch.set_rng_state(rng["torch"])
        np.random.set_state(rng["numpy"])
        random.setstate(rng["python"])
    return TrainState(**json.loads((directory / "state.json").read_text()))
