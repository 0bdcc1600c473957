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

Both ship in the dtype the scheduler asks for (``SnapshotRequest.dtype``), a copy made on rank 0
after the collectives (which stay as they are), each state dict packed into one buffer
(:class:`~d3ray.influence.snapshot.PackedState`, a mapping of views): a ``float32`` numpy array (exact;
Ray ships it without a copy), or a ``bfloat16`` torch tensor (half the bytes; numpy has no bfloat16).
One buffer, not one tensor per parameter: Ray pickles each torch tensor through torch's serializer, and
three per parameter cost the trainer ~10 ms per chunk and the actor ~7 ms (``docs/results/influence-chunk-time-2026-12-02-to-03.md``).
bfloat16 rather than float16: it keeps float32's exponent range, so v = E[g²] (often below float16's
smallest normal, 6e-5) does not underflow. The readers widen to their compute dtype.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from d3ray.influence.optimizer import AdamWState
from d3ray.influence.snapshot import PackedState
from d3ray.schedule.scheduler import SNAPSHOT_DTYPES
from d3ray.train.trainer_rank import TrainerRank

logger = logging.getLogger(__name__)

__all__ = [
    "full_optimizer_state",
    "gathered_drift",
    "master_copies",
    "ship_optimizer_state",
    "ship_state",
    "snapshot_nbytes",
    "snapshot_optimizer_state",
    "snapshot_weights",
]

Shipped = np.ndarray | torch.Tensor

#: Elements of each of m and v per all-reduce when the ZeRO-1/2 optimizer state is assembled (16M: a
#: 128 MiB float32 buffer for the two).
STATE_BUCKET_NUMEL = 1 << 24


def ship_state(state: Mapping[str, Any], dtype: str) -> PackedState:
    """A copy of a state dict (tensors or arrays by name) in the snapshot ``dtype``, packed into one buffer
    (:class:`~d3ray.influence.snapshot.PackedState`: one tensor for Ray to pickle, not one per parameter).

    Raises:
        ValueError: ``dtype`` is not one of ``SNAPSHOT_DTYPES``.
    """
    _check_dtype(dtype)
    return PackedState.pack(state, dtype)


def _check_dtype(dtype: str) -> None:
    if dtype not in SNAPSHOT_DTYPES:
        raise ValueError(f"snapshot dtype must be one of {list(SNAPSHOT_DTYPES)}, got {dtype!r}")


def ship_optimizer_state(state: AdamWState, dtype: str) -> AdamWState:
    """The same optimizer state with m and v in the snapshot ``dtype`` (validated again on creation)."""
    return replace(state, exp_avg=ship_state(state.exp_avg, dtype), exp_avg_sq=ship_state(state.exp_avg_sq, dtype))


def _nbytes(x: Shipped) -> int:
    return x.numel() * x.element_size() if torch.is_tensor(x) else int(np.asarray(x).nbytes)


def snapshot_nbytes(parts: Iterable[Any]) -> int:
    """Bytes of the tensors of a snapshot's parts (weights dicts, AdamWState): the payload ``ray.put``
    copies into the object store, without pickle's few bytes of framing per tensor."""
    total = 0
    for part in parts:
        if isinstance(part, AdamWState):
            total += sum(map(_nbytes, part.exp_avg.values())) + sum(map(_nbytes, part.exp_avg_sq.values()))
        else:
            total += sum(map(_nbytes, part.values()))
    return total


def snapshot_weights(trainer: TrainerRank, dtype: str) -> PackedState | None:
    """The state dict of ``trainer``'s engine in the snapshot ``dtype`` on rank 0 (None elsewhere); a
    collective under ZeRO-3."""
    engine = trainer.engine
    if trainer.zero_stage == 3:
        state = engine._zero3_consolidated_16bit_state_dict()
    else:
        state = engine.module.state_dict() if trainer.is_rank0 else None
    if not trainer.is_rank0:
        return None
    return ship_state(state, dtype)


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


def master_copies(optimizer: Any) -> dict[int, tuple[torch.Tensor, int]]:
    """``id(16-bit parameter) → (fp32 master tensor, offset)``: where DeepSpeed's ZeRO-0 mixed-precision
    wrappers keep the copy the torch optimizer steps (and keys its state by), the parameter's elements
    starting at ``offset`` of the master flattened; empty for any other optimizer.

    ``FP16_UnfusedOptimizer`` (bf16 on the CPU) keeps one fp32 copy per parameter (``fp32_groups``);
    the fused ``FP16_Optimizer`` one flat fp32 tensor per group (``fp32_groups_flat``), the group's
    parameters concatenated in order. ZeRO 1-3 and ``BF16_Optimizer`` link the state through
    ``_hp_mapping`` / ``ds_id`` instead (``safe_get_full_optimizer_state``).
    """
    lp_groups = getattr(optimizer, "fp16_groups", None)
    if lp_groups is None or not (hasattr(optimizer, "fp32_groups_flat") or hasattr(optimizer, "fp32_groups")):
        return {}  # not a ZeRO-0 wrapper (the ZeRO optimizers have fp16_groups too, and flat partitions)
    out: dict[int, tuple[torch.Tensor, int]] = {}
    flat = getattr(optimizer, "fp32_groups_flat", None)
    if flat is not None:
        for group, master in zip(lp_groups, flat, strict=True):
            offset = 0
            for p in group:
                out[id(p)] = (master, offset)
                offset += p.numel()
        return out
    for group, masters in zip(lp_groups, optimizer.fp32_groups, strict=True):
        for p, master in zip(group, masters, strict=True):
            out[id(p)] = (master, 0)
    return out


def _unpartitioned_state(base: Any, masters: dict[int, tuple[torch.Tensor, int]], p: Any,
                         name: str) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(m, v) of a parameter the torch optimizer steps itself or through its fp32 master copy (ZeRO-0)."""
    owner, offset = masters.get(id(p), (p, 0))
    state = base.state.get(owner, {})
    if state and "exp_avg_sq" not in state:
        raise ValueError(f"optimizer state of {name!r} has no exp_avg_sq: not an Adam optimizer")
    if not state:
        return None, None
    if owner is p:
        return state.get("exp_avg"), state.get("exp_avg_sq")
    n = p.numel()
    return tuple(state[key].reshape(-1)[offset:offset + n].view(p.shape) for key in ("exp_avg", "exp_avg_sq"))


def _parameter_state(base: Any, masters: dict[int, tuple[torch.Tensor, int]], zero_stage: int, p: Any,
                     name: str) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(m, v) of one parameter: DeepSpeed assembles a partitioned one (an all-reduce per key; a collective),
    the torch optimizer holds an unpartitioned one (or its fp32 copy)."""
    from deepspeed.utils import safe_get_full_optimizer_state

    m = v = None
    if zero_stage > 0 or hasattr(p, "_hp_mapping") or hasattr(p, "ds_id"):
        m = safe_get_full_optimizer_state(p, "exp_avg")
        v = safe_get_full_optimizer_state(p, "exp_avg_sq")
    if m is None and v is None:  # no ZeRO partitioning: the torch optimizer holds the parameter (or its copy)
        m, v = _unpartitioned_state(base, masters, p, name)
    return m, v


def _flat_partitions(named: list[tuple[str, Any]]) -> bool:
    """Whether every parameter's optimizer state lies in ZeRO-1/2 (or bf16) flat partitions of one
    data-parallel group: the case :func:`_assembled_fragments` gathers in buckets."""
    return bool(named) and all(hasattr(p, "_hp_mapping") and not hasattr(p, "ds_id") for _, p in named) and len(
        {id(getattr(p, "_dp_group", None)) for _, p in named}) == 1


def _assembled_fragments(named: list[tuple[str, Any]], bucket_numel: int = STATE_BUCKET_NUMEL):
    """(name, parameter, (m, v)) of ZeRO-1/2 parameters, each rank's fragments summed over the ranks with
    one all-reduce per bucket of parameters (m and v together) instead of DeepSpeed's one per parameter
    and key (``get_full_hp_param``: 2 x the parameter count of small all-reduces, 10.9% of the training
    time of ``d3ray bench pipeline`` at 2 ranks over gloo). Each rank writes its fragment at the
    parameter's ``lp_fragment_address`` in a zero buffer; the fragments are disjoint, so the sum is the
    same float32 values, bit for bit. A bucket holds at most ``bucket_numel`` elements of each key
    (a larger parameter is a bucket of its own)."""
    import deepspeed.comm as dist

    from d3ray.train.collectives import collective_device

    group = named[0][1]._dp_group
    bucket: list[tuple[str, Any]] = []

    def flush():
        total = sum(p.numel() for _, p in bucket)
        # on the device the group's backend reduces on (NCCL: this rank's GPU; gloo: the CPU)
        buffer = torch.zeros(2 * total, dtype=torch.float32, device=collective_device(group))
        offset = 0
        for _, p in bucket:
            mapping = p._hp_mapping
            if mapping is not None:
                address = mapping.lp_fragment_address
                for k, key in enumerate(("exp_avg", "exp_avg_sq")):
                    start = k * total + offset + address.start
                    buffer.narrow(0, start, address.numel).copy_(mapping.get_hp_fragment(key).data.reshape(-1))
            offset += p.numel()
        dist.all_reduce(buffer, group=group)
        offset = 0
        for name, p in bucket:
            n = p.numel()
            yield name, p, (buffer.narrow(0, offset, n).view(p.shape), buffer.narrow(0, total + offset, n).view(p.shape))
            offset += n

    size = 0
    for name, p in named:
        if bucket and size + p.numel() > bucket_numel:
            yield from flush()
            bucket, size = [], 0
        bucket.append((name, p))
        size += p.numel()
    if bucket:
        yield from flush()


def _optimizer_moments(engine: Any, zero_stage: int, named: list[tuple[str, Any]]):
    """(name, parameter, (m, v)) of every trainable parameter, whole, on every rank: the collectives of
    ZeRO 1-3 are all-reduces (ZeRO-1/2 a bucket of parameters at a time, ZeRO-3 one parameter at a time);
    without ZeRO the torch optimizer's own tensors (or views of its fp32 master copy). m or v is None where
    the optimizer has no state for the parameter. Only after the optimizer's first step (``adamw_started``)."""
    # ZeRO-1/2 link each parameter's optimizer-state fragments lazily, at the first step; a run resumed
    # from a checkpoint holds the loaded state but publishes before its first step: link them now.
    link = getattr(engine.optimizer, "_lazy_init_hp_params_optimizer_state", None)
    if link is not None:
        link()
    if _flat_partitions(named):
        yield from _assembled_fragments(named)
        return
    base = base_optimizer(engine)
    masters = master_copies(engine.optimizer) if zero_stage == 0 else {}  # bf16 ZeRO-0: keyed by fp32 copies
    for name, p in named:
        yield name, p, _parameter_state(base, masters, zero_stage, p, name)


def full_optimizer_state(trainer: TrainerRank) -> AdamWState:
    """The AdamW state of ``trainer``'s DeepSpeed engine (ZeRO 0-2) by parameter name, m and v float32
    and whole, on every rank: what in-trainer scoring needs (``d3ray/train/scheduling/trainer_potential.py``). Every rank must call
    it (the same all-reduces as :func:`snapshot_optimizer_state`, whose result every rank holds anyway).
    The tensors may be the optimizer's own: read them before the next step.

    Raises:
        ValueError: ZeRO-3 (no rank holds whole parameters), or the state is not Adam-like or does not
            match the parameters' names and shapes.
    """
    engine, zero_stage = trainer.engine, trainer.zero_stage
    if zero_stage == 3:
        raise ValueError("full_optimizer_state: under ZeRO-3 no rank holds whole parameters (score on the shards)")
    base = base_optimizer(engine)
    named = _named_trainable(engine)
    hyper = adamw_hyperparameters(engine)
    shapes = {n: _full_shape(p) for n, p in named}
    if not adamw_started(base):  # the same on every rank: they step together
        return AdamWState.fresh(shapes, **hyper)
    m_all: dict[str, Any] = {}
    v_all: dict[str, Any] = {}
    for name, _, (m, v) in _optimizer_moments(engine, zero_stage, named):
        m_all[name] = m if m is not None else torch.zeros(shapes[name])
        v_all[name] = v if v is not None else torch.zeros(shapes[name])
    state = AdamWState(step=adamw_step(base), exp_avg=m_all, exp_avg_sq=v_all, **hyper)
    state.check_covers(shapes)
    return state


def gathered_drift(trainer: TrainerRank) -> tuple[AdamWState, Callable[[], dict[str, torch.Tensor]]] | None:
    """(the AdamW hyperparameters and step count, a function that returns w of eq. P1 by parameter name,
    float32, whole, on every rank) under ZeRO-1/2, or None where the optimizer state does not lie in flat partitions of one group
    (ZeRO-0: a rank holds it whole) or before the first step: the caller then takes
    :func:`full_optimizer_state` and computes w itself. A collective: every rank calls it.

    Each rank computes w = λθ + β1·m ⊘ (b1·d₀) (``d3ray.influence.drift.drift_direction``) on its own
    fragments of m and v, θ read from the module's parameters there (the values the forwards see), and
    all-reduces (a bucket at a time) sum the disjoint fragments into a zero buffer, asynchronously: the
    function waits for them, so the forwards at θ, which need no w, run while w crosses the ranks
    (``d3ray.influence.drift.batched_potentials`` calls it after them). The formula is
    elementwise, so every element is the float32 value w computed from the whole state gets, bit for bit;
    what changes is the cost: one parameter-sized buffer crosses the ranks instead of two (m and v), each
    rank does 1/W of the arithmetic, and no rank holds m and v whole (tests/integration/test_gathered_drift.py).

    The AdamWState returned carries no moments (``exp_avg`` and ``exp_avg_sq`` are empty): its lr, betas, eps,
    weight decay and step are the optimizer's, as :func:`full_optimizer_state` reads them.
    """
    import deepspeed.comm as dist

    from d3ray.influence.drift import drift_direction
    from d3ray.train.collectives import collective_device

    engine = trainer.engine
    base = base_optimizer(engine)
    named = _named_trainable(engine)
    if trainer.zero_stage not in (1, 2) or not _flat_partitions(named) or not adamw_started(base):
        return None  # the same on every rank: the layout and the step count are shared
    link = getattr(engine.optimizer, "_lazy_init_hp_params_optimizer_state", None)
    if link is not None:  # a resumed run scores before its first step
        link()
    state = AdamWState(step=adamw_step(base), exp_avg={}, exp_avg_sq={}, **adamw_hyperparameters(engine))
    group = named[0][1]._dp_group
    device = collective_device(group)
    # this rank's fragments, packed: where each goes in the whole buffer, and θ, m, v in one tensor each
    places, thetas, ms, vs = [], [], [], []
    offset = 0
    for _, p in named:
        mapping = p._hp_mapping
        if mapping is not None:
            address = mapping.lp_fragment_address
            places.append((offset + address.start, address.numel))
            thetas.append(p.detach().reshape(-1).narrow(0, address.start, address.numel).to(torch.float32))
            ms.append(mapping.get_hp_fragment("exp_avg").detach().reshape(-1))
            vs.append(mapping.get_hp_fragment("exp_avg_sq").detach().reshape(-1))
        offset += p.numel()
    whole = torch.zeros(offset, dtype=torch.float32, device=device)
    if places:
        packed = {"w": torch.cat(thetas).to(device)}
        mine = drift_direction(packed, state, ({"w": torch.cat(ms).to(device)}, {"w": torch.cat(vs).to(device)}))["w"]
        at = 0
        for start, numel in places:
            whole.narrow(0, start, numel).copy_(mine.narrow(0, at, numel))
            at += numel
    pending = [dist.all_reduce(whole.narrow(0, start, min(STATE_BUCKET_NUMEL, offset - start)), group=group,
                               async_op=True)  # at most the snapshot's bound on one message
               for start in range(0, offset, STATE_BUCKET_NUMEL)]
    drift, offset = {}, 0
    for name, p in named:
        drift[name] = whole.narrow(0, offset, p.numel()).view(p.shape)
        offset += p.numel()

    def ready() -> dict[str, torch.Tensor]:
        for work in pending:
            work.wait()
        pending.clear()
        return drift

    return state, ready


def snapshot_optimizer_state(trainer: TrainerRank, dtype: str) -> AdamWState | None:
    """The AdamW state of ``trainer``'s DeepSpeed engine (ZeRO 0-3) by parameter name, m and v in the
    snapshot ``dtype``, on rank 0 (None elsewhere).

    Every rank must call it (ZeRO 1-3 gather the state with all-reduces: ZeRO-1/2 a bucket of parameters
    at a time, ZeRO-3 one parameter at a time).

    Raises:
        ValueError: the optimizer is not Adam-like (no ``exp_avg_sq``), or the state does not match
            the parameters' names and shapes.
    """
    engine, zero_stage, rank = trainer.engine, trainer.zero_stage, trainer.rank
    base = base_optimizer(engine)
    named = _named_trainable(engine)
    hyper = adamw_hyperparameters(engine)
    # torch creates AdamW's state at the first step; before it (the snapshot a run publishes at start)
    # the state is zeros. Every rank steps together, so all ranks take this branch or none does.
    if not adamw_started(base):
        if rank != 0:
            return None
        return ship_optimizer_state(AdamWState.fresh({n: _full_shape(p) for n, p in named}, **hyper), dtype)
    _check_dtype(dtype)
    shapes = {n: _full_shape(p) for n, p in named}
    exp_avg = PackedState.empty(shapes, dtype) if rank == 0 else None  # zeros where a parameter has no state
    exp_avg_sq = PackedState.empty(shapes, dtype) if rank == 0 else None
    for name, _, (m, v) in _optimizer_moments(engine, zero_stage, named):
        if rank == 0:  # converted a bucket at a time: rank 0 never holds a float32 copy of all of it
            for packed, value in ((exp_avg, m), (exp_avg_sq, v)):
                if value is not None:
                    packed.fill(name, value)
    if rank != 0:
        return None
    state = AdamWState(step=adamw_step(base), exp_avg=exp_avg, exp_avg_sq=exp_avg_sq, **hyper)
    state.check_covers({n: _full_shape(p) for n, p in named})
    return state
