"""Snapshots a trainer publishes for the influence workers: the weights, and the optimizer state.

Both are collectives under ZeRO (every rank calls, in the same order; rank 0 gets the result):

- weights: under ZeRO-3 ``engine._zero3_consolidated_16bit_state_dict()`` gathers the 16-bit
  weights on rank 0; otherwise rank 0's module holds them whole.
- optimizer state (AdamW m, v, step count, lr/betas/eps/weight decay), for the ``adam``
  preconditioner of the influence stage: ``deepspeed.utils.safe_get_full_optimizer_state`` assembles
  the fp32 state of a parameter from the ZeRO-1/2 flat partitions (``_hp_mapping``) or the ZeRO-3
  partitions (``ds_id``), an all-reduce per parameter; without ZeRO (plain torch AdamW) it is read
  from the optimizer directly. The result is checked against the weights' names and shapes before
  it is shipped, so a wrong state fails here, in the trainer, not in an influence actor.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from d3ray.influence.optimizer import AdamWState

logger = logging.getLogger(__name__)

__all__ = ["initial_optimizer_state", "snapshot_optimizer_state", "snapshot_weights"]


def snapshot_weights(engine: Any, zero_stage: int, rank: int) -> dict[str, np.ndarray] | None:
    """A float32 numpy state dict on rank 0 (None elsewhere); a collective under ZeRO-3."""
    if zero_stage == 3:
        state = engine._zero3_consolidated_16bit_state_dict()
    else:
        state = engine.module.state_dict() if rank == 0 else None
    if rank != 0:
        return None
    # np.array copies: .numpy() of a CPU fp32 tensor is a view of the live parameter.
    return {k: np.array(v.detach().float().cpu().numpy()) for k, v in state.items()}


def _named_trainable(engine: Any) -> list[tuple[str, Any]]:
    return [(n, p) for n, p in engine.module.named_parameters() if p.requires_grad]


def _full_shape(p: Any) -> tuple[int, ...]:
    return tuple(p.ds_shape) if hasattr(p, "ds_shape") else tuple(p.shape)


def base_optimizer(engine: Any) -> Any:
    """The torch optimizer of a DeepSpeed engine (ZeRO wraps it as ``engine.optimizer.optimizer``)."""
    return getattr(engine.optimizer, "optimizer", engine.optimizer)


def adamw_hyperparameters(engine: Any) -> dict[str, Any]:
    """lr (the next step's, after the LR schedule), betas, eps, weight decay and the gradient clip."""
    group = engine.optimizer.param_groups[0]
    return {
        "lr": float(group["lr"]),
        "betas": (float(group["betas"][0]), float(group["betas"][1])),
        "eps": float(group["eps"]),
        "weight_decay": float(group["weight_decay"]),
        "max_grad_norm": float(engine.gradient_clipping() or 0.0),
    }


def adamw_started(base: Any) -> bool:
    """Whether the torch optimizer holds Adam moments (torch creates them at the first step)."""
    return any(isinstance(st, dict) and "exp_avg_sq" in st for st in base.state.values())


def adamw_step(base: Any) -> int:
    """Updates taken so far (the largest per-parameter step count; 0 before the first)."""
    return max((int(st["step"]) for st in base.state.values() if isinstance(st, dict) and "step" in st), default=0)


def snapshot_optimizer_state(engine: Any, zero_stage: int, rank: int) -> AdamWState | None:
    """The AdamW state of a DeepSpeed engine (ZeRO 0-3) by parameter name, on rank 0 (None elsewhere).

    Every rank must call it (ZeRO 1-3 gather each parameter's state with an all-reduce).

    Raises:
        ValueError: the optimizer is not Adam-like (no ``exp_avg_sq``), or the state does not match
            the parameters' names and shapes.
    """
    from deepspeed.utils import safe_get_full_optimizer_state

    base = base_optimizer(engine)
    named = _named_trainable(engine)
    hyper = adamw_hyperparameters(engine)
    # torch creates AdamW's state at the first step; before it (the snapshot a run publishes at start)
    # the state is zeros. Every rank steps together, so all ranks take this branch or none does.
    if not adamw_started(base):
        return AdamWState.fresh({n: _full_shape(p) for n, p in named}, **hyper) if rank == 0 else None
    # ZeRO-1/2 link each parameter's optimizer-state fragments lazily, at the first step; a run resumed
    # from a checkpoint holds the loaded state but publishes before its first step: link them now.
    link = getattr(engine.optimizer, "_lazy_init_hp_params_optimizer_state", None)
    if link is not None:
        link()
    exp_avg, exp_avg_sq = {}, {}
    for name, p in named:
        m = v = None
        if zero_stage > 0 or hasattr(p, "_hp_mapping") or hasattr(p, "ds_id"):
            m = safe_get_full_optimizer_state(p, "exp_avg")
            v = safe_get_full_optimizer_state(p, "exp_avg_sq")
        if m is None and v is None:  # no ZeRO partitioning: the torch optimizer holds the parameter
            state = base.state.get(p, {})
            if state and "exp_avg_sq" not in state:
                raise ValueError(f"optimizer state of {name!r} has no exp_avg_sq: not an Adam optimizer")
            m, v = state.get("exp_avg"), state.get("exp_avg_sq")
        if rank == 0:
            shape = _full_shape(p)
            # np.array copies: without ZeRO these are views of the live optimizer state.
            exp_avg[name] = np.zeros(shape, np.float32) if m is None else np.array(m.detach().float().cpu().numpy())
            exp_avg_sq[name] = (
                np.zeros(shape, np.float32) if v is None else np.array(v.detach().float().cpu().numpy())
            )
    if rank != 0:
        return None
    state = AdamWState(step=adamw_step(base), exp_avg=exp_avg, exp_avg_sq=exp_avg_sq, **hyper)
    state.check_covers({n: _full_shape(p) for n, p in named})
    return state


def initial_optimizer_state(model: Any, lr: float, betas: tuple[float, float], weight_decay: float,
                            max_grad_norm: float, eps: float = 1e-8) -> AdamWState:
    """The state before the first step (m = v = 0, step 0) of a model's trainable parameters, for the
    weights published before training starts; ``lr`` is the first step's (after warmup scaling)."""
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters() if p.requires_grad}
    return AdamWState.fresh(shapes, lr=lr, betas=(float(betas[0]), float(betas[1])), eps=eps,
                            weight_decay=weight_decay, max_grad_norm=max_grad_norm)
