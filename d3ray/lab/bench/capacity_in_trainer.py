"""The capacity model's in-trainer (sharded) placement: the trainer ranks score on their ZeRO-3 shards.

The W ranks score chunk c+1 on their ZeRO-3 shards between chunks, so all of
it is trainer wait. A ZeRO-3 forward+backward all-gathers the 16-bit parameters twice and
reduce-scatters 16-bit gradients (Rajbhandari et al. 2020, ZeRO §7: 3× the model's bytes), whatever n.
Built on the shared terms of :mod:`d3ray.lab.bench.capacity_model` (the symbols, c_b and t_allreduce are
defined there):

    t_gather = 6·N·(W−1)/W / bw_coll(W),   t_fb = F·n·T / (W·peak·mfu_in_trainer)   (the engine's 16-bit module)
    wait = Σ_groups max(g·t_fb, t_gather) + L·c_b·N/(W·bw_mem) + (80 + 16)·N/(W·bw_mem)

(the 16: ``AdamWState.tensors`` copies the rank's m, v slices once per chunk), with g =
``batches_per_gather`` batches per parameter gather (1: a forward+backward per batch, as the trainers'
engine runs it; L: each layer gathered once per chunk).

Memory (bytes):

    in-trainer extra per rank = 4N/W·g gradient shards [+ 8N/W m, v copies] (drift: + 4N/W w;
                     sketched: + 4N/W·(S − 1 + 3S) work vectors + SJLT cache of N/W)
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from d3ray.lab.bench.capacity_arch import Architecture, param_count
from d3ray.lab.bench.capacity_model import (
    DeviceConstants,
    InfluenceLoad,
    Memory,
    allreduce_sec,
    batch_coordinate_bytes,
    chunk_coordinate_bytes,
    fwd_bwd_sec,
    scored_sequences,
    sketch_work_memory,
    train_step_sec,
)

__all__ = [
    "InTrainerPlan",
    "in_trainer_extra_memory",
    "in_trainer_plan",
    "in_trainer_wait_sec",
    "kvector_bytes",
    "zero3_bytes_per_batch",
]


def kvector_bytes(load: InfluenceLoad) -> float:
    """What leaves the ranks per chunk: L float64 potentials f (drift), and S × L × (k + control-variate
    columns) float32 sketch rows when something is sketched."""
    f = 8.0 * load.L if load.potential else 0.0
    rows = 4.0 * load.stats * load.L * (load.k + (load.control_variate_columns if load.control_variate else 0))
    return f + rows


def zero3_bytes_per_batch(arch: Architecture) -> float:
    """ZeRO-3 traffic of one forward+backward: two 16-bit parameter all-gathers + a 16-bit reduce-scatter."""
    return 6.0 * param_count(arch)


def _gather_sec(arch: Architecture, dev: DeviceConstants, ranks: int) -> float:
    """One ZeRO-3 forward+backward's parameter and gradient traffic per rank (0 for one rank)."""
    if ranks <= 1:
        return 0.0
    return zero3_bytes_per_batch(arch) * (ranks - 1) / ranks / dev.collective_bytes_per_sec(ranks)


def _groups(load: InfluenceLoad) -> list[int]:
    """Batches per ZeRO-3 gather: L // g groups of g, then the remainder."""
    g = load.batches_per_gather
    return [g] * (load.L // g) + ([load.L % g] if load.L % g else [])


def _in_trainer_coords_sec(arch: Architecture, load: InfluenceLoad, dev: DeviceConstants, ranks: int) -> float:
    """The O(N/W) work of a chunk on each rank: L batches' c_b and the chunk's w (+ m, v copies). The
    trainers score with the gradient whatever the actors' ``potential_method`` (ZeRO-3 slices)."""
    load = replace(load, potential_method="gradient")
    N = param_count(arch)
    per_coord = load.L * batch_coordinate_bytes(load, N / ranks) + chunk_coordinate_bytes(load, in_trainer=True)
    return per_coord * N / ranks / dev.memory_bytes_per_sec


def _in_trainer_collectives_sec(load: InfluenceLoad, dev: DeviceConstants, ranks: int) -> float:
    """Per batch: one scalar all-reduce of f_i (drift); the (S, k) projection's all-reduce when sketched."""
    per_batch = allreduce_sec(8.0, ranks, dev) if load.potential else 0.0
    if load.sketches:
        per_batch += allreduce_sec(4.0 * load.statistics * load.k, ranks, dev)
    return load.L * per_batch


def in_trainer_wait_sec(arch: Architecture, load: InfluenceLoad, dev: DeviceConstants, ranks: int,
                        sequences: int | None = None) -> float:
    """Trainer wait per chunk: per gather group max(compute, traffic) (ZeRO-3 prefetch overlaps them), the
    O(N/W) work, the per-batch collectives."""
    n = scored_sequences(arch.batch_sequences, load.sample_fraction) if sequences is None else sequences
    compute = fwd_bwd_sec(arch, dev, n, ranks, in_trainer=True)  # one batch's n sequences over W ranks
    gather = _gather_sec(arch, dev, ranks)
    scoring = sum(max(size * compute, gather) for size in _groups(load))
    return scoring + _in_trainer_coords_sec(arch, load, dev, ranks) + _in_trainer_collectives_sec(load, dev, ranks)


def in_trainer_extra_memory(arch: Architecture, load: InfluenceLoad, ranks: int) -> Memory:
    """Per-rank memory beyond training: the fp32 gradient shards, the fp32 copies of the m, v slices
    (``AdamWState.tensors``), the drift w's slice, and when sketching the work vectors' shards and the
    SJLT cache of the shard. The n/W sequences' activations reuse training's."""
    shard = param_count(arch) / ranks
    parts = {"gradient shards (fp32)": 4.0 * shard * load.batches_per_gather}
    if load.adam:
        parts["m, v copies (fp32)"] = 8.0 * shard
    if load.potential:
        parts["drift w (fp32)"] = 4.0 * shard
    parts.update(sketch_work_memory(load, shard))
    return Memory(parts)


@dataclass(frozen=True, kw_only=True)
class InTrainerPlan:
    """In-trainer mode at W ranks: wait at the configured s, and the largest s within the target."""

    kvector_bytes_per_chunk: float
    zero3_bytes_per_chunk: float
    """Interconnect traffic per rank for scoring (the weights never leave the collective)."""
    extra_memory: Memory
    chunk_train_sec: float
    wait_sec: float
    wait_fraction: float
    max_sample_fraction: float | None
    """Largest n/B with wait ≤ target; None when even n = 1 misses it."""
    reason: str


def in_trainer_plan(arch: Architecture, load: InfluenceLoad, dev: DeviceConstants, ranks: int) -> InTrainerPlan:
    """The largest n ≤ B whose wait meets the target (wait is non-decreasing in n), as a fraction n/B."""
    chunk = load.L * train_step_sec(arch, dev, ranks)
    budget = load.wait_target * chunk
    wait = in_trainer_wait_sec(arch, load, dev, ranks)
    lo, hi = 0, arch.batch_sequences  # invariant: wait(lo) ≤ budget (lo = 0: none), wait(hi + 1) > budget
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if in_trainer_wait_sec(arch, load, dev, ranks, mid) <= budget:
            lo = mid
        else:
            hi = mid - 1
    reason = ""
    gathers = len(_groups(load)) * _gather_sec(arch, dev, ranks)
    coords = _in_trainer_coords_sec(arch, load, dev, ranks)
    if lo == 0 and gathers > budget:
        reason = f"the ZeRO-3 gathers alone take {gathers / chunk:.1%} of a chunk"
    elif lo == 0 and coords > budget:
        reason = f"the O(N/W) work alone takes {coords / chunk:.1%} of a chunk"
    elif lo == 0:
        reason = f"one sequence per batch already takes {in_trainer_wait_sec(arch, load, dev, ranks, 1) / chunk:.1%}"
    return InTrainerPlan(
        kvector_bytes_per_chunk=kvector_bytes(load),
        zero3_bytes_per_chunk=len(_groups(load)) * zero3_bytes_per_batch(arch) * (ranks - 1) / ranks,
        extra_memory=in_trainer_extra_memory(arch, load, ranks), chunk_train_sec=chunk, wait_sec=wait,
        wait_fraction=wait / chunk, max_sample_fraction=lo / arch.batch_sequences if lo else None, reason=reason,
    )
