"""A run's checkpoint, written at any ZeRO stage by any number of ranks → the census worker's one-rank ZeRO-0 engine.

    checkpoint_K/deepspeed/ds/
      ZeRO-0    mp_rank_00_model_states.pt (weights, torch AdamW state, LR schedule, counters)
                   ─► engine.load_checkpoint, DeepSpeed's own load (d3ray/train/checkpoint.py)
      ZeRO-1/2  mp_rank_00_model_states.pt (LR schedule, counters, parameter shapes)
                + zero_pp_rank_<r>_mp_rank_00_optim_states.pt, r = 0 .. W−1 (rank r's flat fp32 partition
                  and its AdamW exp_avg, exp_avg_sq, step)
      ZeRO-3    zero_pp_rank_<r>_mp_rank_00_model_states.pt + zero_pp_rank_<r>_mp_rank_00_optim_states.pt
                   │
                   ▼  DeepSpeed's zero_to_fp32 merge of the W partitions, once per state: the fp32 master
                      weights, then exp_avg and exp_avg_sq (the moments lie in the same flat layout as the
                      master weights, the layout ds_to_universal cuts them by)
                   ▼
      the engine's weights, its torch AdamW state per parameter and param groups (lr, betas, ...),
      the LR schedule and the step counters; rank 0's RNG (rng_rank0.pt)

Why one ZeRO-0 rank and not the run's stage (d3ray/lab/census/README.md, "ZeRO 0-3"): ZeRO shards the same
elementwise AdamW over ranks; with one rank there is nothing to shard, and the torch AdamW state of a ZeRO-0
engine is what the worker copies and restores per branch. The branch trains with the trainers' own
``train_step``; the integration test checks that a branch in the run's order reproduces the run's next
checkpoint at ZeRO-2 and ZeRO-3.

``check_checkpoint`` runs in the driver before Ray starts: a checkpoint the census cannot restore (a missing
model-states file or optimizer shard, bf16 master weights at ZeRO 1-3) is refused in one line naming it.
"""

from __future__ import annotations

import contextlib
import io
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from d3ray.errors import UserError
from d3ray.safe_load import load_data
from d3ray.train.checkpoint import DS_TAG

MODEL_STATES = "mp_rank_00_model_states.pt"


def _shard(rank: int, kind: str) -> str:
    return f"zero_pp_rank_{rank}_mp_rank_00_{kind}_states.pt"


@dataclass(frozen=True)
class CheckpointLayout:
    """What a checkpoint's DeepSpeed directory holds: its ZeRO stage and the data-parallel ranks that wrote it."""

    directory: Path
    """``<checkpoint>/deepspeed/ds``."""
    stage: int
    world_size: int
    bf16: bool


def deepspeed_checkpoint_globals() -> list[Any]:
    """The DeepSpeed classes a ZeRO checkpoint's files hold besides tensors (its loss scaler, the fp32
    fragments' addresses, the ZeRO stage): allowed, with nothing else, when the census reads them."""
    from d3ray.deepspeed_import import import_deepspeed

    import_deepspeed()  # without its autotuner's MLflow import
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, ZeroStageEnum, fragment_address]


def _load(path: Path) -> dict[str, Any]:
    """A DeepSpeed checkpoint file, as data only (weights-only unpickling) with DeepSpeed's few
    classes allowed (d3ray/safe_load.py); its tensors memory-mapped, read where used."""
    return load_data(path, allow=deepspeed_checkpoint_globals(), map_location="cpu", mmap=True)


def checkpoint_layout(checkpoint: Path) -> CheckpointLayout:
    """The ZeRO stage, the data-parallel world size and the precision of ``checkpoint``'s DeepSpeed state,
    read from its rank-0 model-states file (memory-mapped: the weights are not read).

    Raises:
        UserError: no DeepSpeed state, or a model-states file missing or not DeepSpeed's.
    """
    ds = Path(checkpoint) / "deepspeed" / DS_TAG
    if not ds.is_dir():
        raise UserError(f"census: checkpoint {checkpoint} has no DeepSpeed state ({ds} is missing)")
    rank0 = ds / MODEL_STATES if (ds / MODEL_STATES).is_file() else ds / _shard(0, "model")
    if not rank0.is_file():
        raise UserError(f"census: checkpoint {checkpoint} cannot be restored: {ds} has no model states "
                        f"({MODEL_STATES} for ZeRO 0-2, {_shard(0, 'model')} for ZeRO-3)")
    try:
        states = _load(rank0)
        config = states["ds_config"]
        world_size = int(states["dp_world_size"])
    except Exception as err:  # noqa: BLE001 - a truncated or foreign file: one line naming it
        raise UserError(f"census: checkpoint {checkpoint} cannot be restored: {rank0} is not a readable DeepSpeed "
                        f"model-states file ({type(err).__name__}: {err})") from err
    stage = int(config.get("zero_optimization", {}).get("stage", 0))
    bf16 = bool(config.get("bf16", {}).get("enabled", False))
    return CheckpointLayout(directory=ds, stage=stage, world_size=world_size, bf16=bf16)


def check_checkpoint(checkpoint: Path) -> CheckpointLayout:
    """Refuse, before any Ray or training, a checkpoint the census cannot restore: every rank's optimizer shard
    (and at ZeRO-3 its model states) must be there, and ZeRO 1-3 must hold fp32 master weights.

    Raises:
        UserError: one line naming the checkpoint and what is missing.
    """
    layout = checkpoint_layout(checkpoint)
    if layout.stage == 0:
        return layout  # engine.load_checkpoint reads it as the trainers do on resume
    if layout.bf16:
        raise UserError(f"census: checkpoint {checkpoint} was written at ZeRO-{layout.stage} in bf16; the census merges "
                        "ZeRO 1-3 shards into an fp32 one-rank engine only (d3ray/lab/census/README.md): census an fp32 "
                        "run (train.precision=fp32) or a ZeRO-0 one")
    kinds = ("optim", "model") if layout.stage == 3 else ("optim",)
    missing = [_shard(r, kind) for kind in kinds for r in range(layout.world_size)
               if not (layout.directory / _shard(r, kind)).is_file()]
    if missing:
        ranks = sorted({int(name.split("_")[3]) for name in missing})
        what = "optimizer shard" if layout.stage < 3 else "ZeRO-3 shards (optimizer, model states)"
        raise UserError(f"census: checkpoint {checkpoint} cannot be restored: the {what} of rank(s) "
                        f"{', '.join(map(str, ranks))} of the {layout.world_size} ranks that wrote it "
                        f"{'is' if len(missing) == 1 else 'are'} missing from {layout.directory} ({', '.join(missing)})")
    return layout


@dataclass
class MergedState:
    """A ZeRO 1-3 checkpoint merged over its ranks: name → full fp32 tensor for the weights and both moments."""

    weights: dict[str, Any]
    exp_avg: dict[str, Any]
    exp_avg_sq: dict[str, Any]
    step: Any
    param_groups: list[dict[str, Any]]
    lr_scheduler: dict[str, Any] | None
    counters: dict[str, int]


def merge_zero_checkpoint(checkpoint: Path) -> MergedState:
    """Every rank's partition of ``checkpoint`` (ZeRO 1-3) merged by DeepSpeed's zero_to_fp32, for the fp32
    master weights and for each AdamW moment."""
    from deepspeed.utils import zero_to_fp32 as z

    layout = check_checkpoint(checkpoint)
    ds = str(layout.directory)
    with contextlib.redirect_stdout(io.StringIO()):  # zero_to_fp32 prints its progress
        model_states = z.parse_model_states(z.get_model_state_files(ds))
        shards = [_load(layout.directory / _shard(r, "optim"))["optimizer_state_dict"] for r in range(layout.world_size)]
        if layout.stage <= 2:
            flat_key, base = "single_partition_of_fp32_groups", [s["base_optimizer_state"] for s in shards]
        else:
            flat_key, base = "fp32_flat_groups", [s["optimizer_state_dict"] for s in shards]
        groups = len(shards[0][flat_key])
        flats = {"weights": [s[flat_key] for s in shards],
                 **{key: [[b["state"][g][key] for g in range(groups)] for b in base] for key in ("exp_avg", "exp_avg_sq")}}
        merged: dict[str, dict[str, Any]] = {}
        for key, flat in flats.items():
            if layout.stage <= 2:
                full = z._get_fp32_state_dict_from_zero2_checkpoint(
                    layout.world_size, flat, model_states, key != "weights", shards[0].get("param_alignment_paddings"))
            else:
                full = z.to_torch_tensor(z._get_fp32_state_dict_from_zero3_checkpoint(
                    layout.world_size, flat, model_states, key != "weights"))
            merged[key] = {name: tensor.detach().clone() for name, tensor in full.items()}
    rank0 = _load(layout.directory / (MODEL_STATES if layout.stage <= 2 else _shard(0, "model")))
    return MergedState(
        weights=merged["weights"], exp_avg=merged["exp_avg"], exp_avg_sq=merged["exp_avg_sq"],
        step=base[0]["state"][0]["step"], param_groups=base[0]["param_groups"],
        lr_scheduler=rank0.get("lr_scheduler"),
        counters={k: int(rank0.get(k) or 0) for k in ("global_steps", "global_samples", "skipped_steps")})


def load_merged(engine, checkpoint: Path) -> None:
    """Load a ZeRO 1-3 ``checkpoint`` into a one-rank ZeRO-0 fp32 ``engine`` (its optimizer a torch AdamW):
    weights, AdamW moments and step per parameter, the saved param groups' hyperparameters (the LR at the
    checkpoint among them), the LR schedule, the step counters and rank 0's RNG."""
    import torch

    optimizer = engine.optimizer
    if not isinstance(optimizer, torch.optim.Optimizer) or engine.zero_optimization():
        raise RuntimeError(f"the census engine must be ZeRO-0 with a torch optimizer (got {type(optimizer).__name__})")
    state = merge_zero_checkpoint(checkpoint)
    description = json.loads((Path(checkpoint) / "model.json").read_text())
    engine.module.load_state_dict(state.weights, strict=description.get("base_model") is None)
    names = {id(p): name for name, p in engine.module.named_parameters()}
    current = optimizer.state_dict()
    if len(current["param_groups"]) != len(state.param_groups):
        raise RuntimeError(f"{checkpoint}: {len(state.param_groups)} optimizer param groups, the census engine has "
                           f"{len(current['param_groups'])}")
    per_param: dict[int, dict[str, Any]] = {}
    index = 0
    for group in optimizer.param_groups:
        for p in group["params"]:
            name = names[id(p)]
            per_param[index] = {"step": state.step.detach().clone(),
                                "exp_avg": state.exp_avg[name].reshape(p.shape).to(p.dtype),
                                "exp_avg_sq": state.exp_avg_sq[name].reshape(p.shape).to(p.dtype)}
            index += 1
    groups = [{**{k: v for k, v in saved.items() if k != "params"}, "params": own["params"]}
              for saved, own in zip(state.param_groups, current["param_groups"], strict=True)]
    optimizer.load_state_dict({"state": per_param, "param_groups": groups})
    if state.lr_scheduler is not None and engine.lr_scheduler is not None:
        engine.lr_scheduler.load_state_dict(state.lr_scheduler)
    engine.global_steps = state.counters["global_steps"]
    engine.global_samples = state.counters["global_samples"]
    engine.skipped_steps = state.counters["skipped_steps"]
    rng_file = Path(checkpoint) / "rng_rank0.pt"
    if rng_file.exists():
        rng = load_data(rng_file)  # weights only, NumPy arrays allowed (d3ray/safe_load.py)
        torch.set_rng_state(rng["torch"])
        np.random.set_state(rng["numpy"])
        random.setstate(rng["python"])


def load_for_census(engine, checkpoint: Path) -> None:
    """``checkpoint`` into the census worker's one-rank ZeRO-0 ``engine``, whatever ZeRO stage wrote it."""
    from d3ray.train.checkpoint import load_checkpoint

    if checkpoint_layout(checkpoint).stage == 0:
        load_checkpoint(engine, Path(checkpoint), 0)
    else:
        load_merged(engine, Path(checkpoint))
