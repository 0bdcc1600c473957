"""The capacity model of D3's influence stage: memory, bytes and time per chunk, in both placements.

Pure functions of an :class:`~d3ray.bench.capacity_arch.Architecture`, the influence knobs
(:class:`InfluenceLoad`) and the constants of a device (:class:`DeviceConstants`: measured on this
machine, projected for GPUs, or measured on a GPU by ``bench/gpu_check.sh``). Context: issue 15 and
ARCHITECTURE.md "Influence at scale". Symbols: N parameters, B sequences per batch, T tokens per
sequence, L batches per chunk, s = sample_fraction, n = max(1, round(s·B)) scored sequences per batch
(``d3ray.influence.worker.sample_rows``), W trainer ranks, G influence actors, k sketch size.

Time of one trained chunk (staleness 1: chunk c+1 is scored while chunk c trains):

    t_step = F·B·T / (W·peak·mfu_train),   F = 6·N_mm + 12·l·h·T (PaLM appendix B),   t_chunk = L·t_step

One scored batch = one forward+backward of n sequences, then O(N) work per coordinate (AdamW direction,
SJLT projection, control-variate dots; ``d3ray.influence.chunk.sketch_chunk``):

    t_batch(ranks) = F·n·T / (ranks·peak·mfu_influence) + c_coord·N / ranks

Snapshot mode (today: trainer rank 0 gathers and ``ray.put``s 16-bit weights (and m, v), a full replica
per actor; ``d3ray.train.loop.publish_snapshot`` is synchronous, so the trainers wait for it):

    bytes/chunk = 2·N·(3 with adam, else 1)
    t_publish = bytes·(W−1)/W / bw_collective(W) + bytes / bw_d2h + bytes / bw_put       (trainer wait)
    t_score(G) = ⌈G/D⌉·bytes / bw_object + bytes / bw_get + bytes / bw_h2d + ⌈L/G⌉·t_batch(1)
                 (one pull per node of D devices, all from the publishing node, one after the other)
    wait = t_publish + max(0, t_score(G) − t_chunk)

G ≤ L: a batch is not split across actors (the AdamW direction u is not linear in the batch's gradient,
so its sketch needs the whole gradient of the batch in one place).

In-trainer (sharded) mode: the W ranks score chunk c+1 on their ZeRO-3 shards between chunks, so all of
it is trainer wait. A ZeRO-3 forward+backward all-gathers the 16-bit parameters twice and
reduce-scatters 16-bit gradients (Rajbhandari et al. 2020, ZeRO §7: 3× the model's bytes), whatever n:

    t_gather = 6·N·(W−1)/W / bw_collective(W),   t_fb = F·n·T / (W·peak·mfu_influence)
    wait = Σ_groups max(g·t_fb, t_gather) + L·c_coord·N/W + t_allreduce(stats·L·(k+3) floats)

    t_allreduce(bytes) = 2·(W−1)/W · bytes / bw_collective(W) + 2·⌈log2 W⌉·latency  (ring bandwidth, tree latency)

with g = ``batches_per_gather`` batches per parameter gather (1: a forward+backward per batch, as the
trainers' engine runs it; L: each layer gathered once per chunk, prefetch overlapping compute).
Both modes target wait / t_chunk ≤ 2% (issue 15).

Memory (bytes; activations from ``capacity_arch.activation_bytes``):

    actor floor    = 2N weights + 4N gradient [+ 4N m, v in 16-bit + 4N u] + activations of min(n, micro-batch)
                     sequences, 16-bit, flash attention (gradient accumulated over micro-batches)
    actor as coded = 4N weights + 4N gradient + 4N·(S − 1 + 3S) work vectors [+ 8N m, v] + SJLT cache
                     + activations of all n sequences at once, float32, eager attention
    in-trainer extra per rank = 4N/W·g gradient shards + 4N/W·(S − 1 + 3S) work vectors + SJLT cache of N/W

with S statistics per batch (g and u under adam); the work vectors are what ``sketch_chunk`` holds with
the control variate: the statistics besides g, their stacked copy for one projection, the reference's
directions and the running sums for the next reference.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from d3ray.bench.capacity_arch import Architecture, activation_bytes, param_count, train_flops_per_token

__all__ = [
    "DeviceConstants",
    "InTrainerPlan",
    "InfluenceLoad",
    "Memory",
    "SnapshotPlan",
    "actor_memory_as_coded",
    "actor_memory_floor",
    "allreduce_sec",
    "in_trainer_extra_memory",
    "in_trainer_plan",
    "in_trainer_wait_sec",
    "influence_batch_sec",
    "kvector_bytes",
    "scored_sequences",
    "snapshot_bytes",
    "snapshot_plan",
    "snapshot_publish_sec",
    "snapshot_score_sec",
    "snapshot_wait_sec",
    "train_step_sec",
    "zero3_bytes_per_batch",
]

#: Bytes per SJLT nonzero in the sketch's cache: an int64 row index and a float32 signed value.
_SJLT_CACHE_BYTES_PER_NONZERO = 12


@dataclass(frozen=True, kw_only=True)
class DeviceConstants:
    """What a device and its interconnect do per second; ``provenance`` says where each number comes from."""

    name: str
    memory_bytes: float
    """Accelerator memory (host RAM for the CPU)."""
    peak_flops: float
    """Dense 16-bit FLOP/s of one device (the CPU: its measured training FLOP/s, with mfu_train = 1)."""
    mfu_train: float
    """Fraction of ``peak_flops`` a training step reaches."""
    mfu_influence: float
    """Fraction of ``peak_flops`` the influence forward+backward of n sequences reaches."""
    coordinate_sec: float
    """c_coord: seconds per parameter per scored batch beyond the forward+backward (one device)."""
    put_bytes_per_sec: float
    """``ray.put`` of the snapshot on the publishing host."""
    get_bytes_per_sec: float
    """``ray.get`` + copy of the snapshot in an actor's process."""
    host_device_bytes_per_sec: float
    """Device ↔ host copies (PCIe; infinite on a CPU)."""
    object_bytes_per_sec: float
    """Ray object transfer from the publishing node to an actor's node."""
    intra_node_bytes_per_sec: float
    """Collective bus bandwidth per device inside a node (NVLink; gloo on a CPU)."""
    inter_node_bytes_per_sec: float
    """Collective bus bandwidth per device across nodes (InfiniBand)."""
    devices_per_node: int
    collective_latency_sec: float
    """Per-step latency of a small collective."""
    provenance: Mapping[str, str] = field(default_factory=dict)
    """Field name → ``measured: ...``, ``spec: ...`` or ``projection: ...``."""

    def __post_init__(self) -> None:
        for name in ("memory_bytes", "peak_flops", "mfu_train", "mfu_influence", "put_bytes_per_sec",
                     "get_bytes_per_sec", "host_device_bytes_per_sec", "object_bytes_per_sec",
                     "intra_node_bytes_per_sec", "inter_node_bytes_per_sec"):
            if not getattr(self, name) > 0:
                raise ValueError(f"DeviceConstants.{name} must be > 0, got {getattr(self, name)}")
        if self.coordinate_sec < 0 or self.collective_latency_sec < 0 or self.devices_per_node < 1:
            raise ValueError(f"DeviceConstants {self.name}: negative time or devices_per_node < 1")

    def collective_bytes_per_sec(self, ranks: int) -> float:
        """Bus bandwidth of a collective over ``ranks`` devices: NVLink inside one node, else the network."""
        return self.intra_node_bytes_per_sec if ranks <= self.devices_per_node else self.inter_node_bytes_per_sec

    @property
    def projected_fields(self) -> list[str]:
        """Fields whose value is a projection (not measured, not a spec sheet)."""
        return sorted(k for k, v in self.provenance.items() if v.startswith("projection"))


@dataclass(frozen=True, kw_only=True)
class InfluenceLoad:
    """The influence knobs that set its cost (``InfluenceConfig`` and ``ScheduleConfig.L`` defaults; k is
    the paper's 3,500, which the published tables use: k moves only the k-vectors' bytes and all-reduce)."""

    L: int = 8
    sample_fraction: float = 0.125
    k: int = 3500
    statistics: int = 2
    """Vectors sketched per batch: g and the AdamW direction u (first_order + adam); +2 (q, h) with curvature."""
    adam: bool = True
    """Preconditioner ``adam``: m and v travel with the weights and u is a vector of its own."""
    control_variate_columns: int = 3
    sjlt_s: int = 4
    sjlt_cache_bytes: float = 2.0**30
    wait_target: float = 0.02
    batches_per_gather: int = 1
    """In-trainer mode: scored batches that share one ZeRO-3 parameter gather. 1: one forward+backward per
    batch; L: every layer gathered once per chunk and run on all L batches' sequences, with per-batch
    gradients of the shard (L gradient shards in memory)."""

    def __post_init__(self) -> None:
        if self.L < 1 or self.k < 1 or self.statistics < 1 or not 0 < self.sample_fraction <= 1:
            raise ValueError(f"InfluenceLoad needs L, k, statistics >= 1 and 0 < sample_fraction <= 1: {self}")
        if not 1 <= self.batches_per_gather <= self.L:
            raise ValueError(f"batches_per_gather must be in [1, L={self.L}], got {self.batches_per_gather}")
        if not 0 < self.wait_target < 1:
            raise ValueError(f"wait_target must be in (0, 1), got {self.wait_target}")


@dataclass(frozen=True)
class Memory:
    """Bytes by component; ``total`` is their sum."""

    parts: Mapping[str, float]

    @property
    def total(self) -> float:
        return float(sum(self.parts.values()))


# ---- time ---------------------------------------------------------------------------------------------
def scored_sequences(batch_sequences: int, sample_fraction: float) -> int:
    """n = max(1, round(s·B)): the sequences of a batch that are scored (``sample_rows``)."""
    return max(1, int(round(sample_fraction * batch_sequences)))


def train_step_sec(arch: Architecture, dev: DeviceConstants, ranks: int) -> float:
    """t_step = F·B·T / (W·peak·mfu_train)."""
    tokens = arch.batch_sequences * arch.seq_len
    return train_flops_per_token(arch) * tokens / (ranks * dev.peak_flops * dev.mfu_train)


def _fwd_bwd_sec(arch: Architecture, dev: DeviceConstants, sequences: int, ranks: int) -> float:
    return train_flops_per_token(arch) * sequences * arch.seq_len / (ranks * dev.peak_flops * dev.mfu_influence)


def influence_batch_sec(arch: Architecture, load: InfluenceLoad, dev: DeviceConstants) -> float:
    """t_batch(1): one scored batch on a full-replica actor (forward+backward of n, then c_coord·N)."""
    n = scored_sequences(arch.batch_sequences, load.sample_fraction)
    return _fwd_bwd_sec(arch, dev, n, 1) + dev.coordinate_sec * param_count(arch)


def allreduce_sec(num_bytes: float, ranks: int, dev: DeviceConstants) -> float:
    """Ring bandwidth term 2·(W−1)/W·bytes/bw plus tree latency 2·⌈log2 W⌉·latency; 0 for one rank."""
    if ranks <= 1:
        return 0.0
    bw = dev.collective_bytes_per_sec(ranks)
    return 2.0 * (ranks - 1) / ranks * num_bytes / bw + 2 * math.ceil(math.log2(ranks)) * dev.collective_latency_sec


# ---- snapshot mode ------------------------------------------------------------------------------------
def snapshot_bytes(arch: Architecture, load: InfluenceLoad) -> float:
    """2 bytes × (weights + m + v with adam)."""
    return 2.0 * param_count(arch) * (3 if load.adam else 1)


def snapshot_publish_sec(arch: Architecture, load: InfluenceLoad, dev: DeviceConstants, ranks: int) -> float:
    """Trainer-side publish: ZeRO-3 gather to rank 0, device→host copy, ``ray.put`` (all synchronous)."""
    nbytes = snapshot_bytes(arch, load)
    gather = nbytes * (ranks - 1) / ranks / dev.collective_bytes_per_sec(ranks) if ranks > 1 else 0.0
    return gather + nbytes / dev.host_device_bytes_per_sec + nbytes / dev.put_bytes_per_sec


def snapshot_score_sec(arch: Architecture, load: InfluenceLoad, dev: DeviceConstants, actors: int) -> float:
    """t_score(G): one pull per actor node (actors of a node share its object store), one after the other
    from the publishing node; then each actor's get + host→device copy, and its ⌈L/G⌉ batches."""
    nbytes = snapshot_bytes(arch, load)
    nodes = math.ceil(actors / dev.devices_per_node)
    fetch = nodes * nbytes / dev.object_bytes_per_sec + nbytes / dev.get_bytes_per_sec
    fetch += nbytes / dev.host_device_bytes_per_sec
    return fetch + math.ceil(load.L / actors) * influence_batch_sec(arch, load, dev)


def snapshot_wait_sec(arch: Architecture, load: InfluenceLoad, dev: DeviceConstants, ranks: int, actors: int) -> float:
    """Trainer wait per chunk: t_publish + max(0, t_score(G) − t_chunk)."""
    chunk = load.L * train_step_sec(arch, dev, ranks)
    late = max(0.0, snapshot_score_sec(arch, load, dev, actors) - chunk)
    return snapshot_publish_sec(arch, load, dev, ranks) + late


def actor_memory_floor(arch: Architecture, load: InfluenceLoad) -> Memory:
    """Least memory of a full-replica actor: 16-bit weights (and m, v), float32 gradient (and u, the AdamW
    direction), 16-bit activations of one micro-batch with flash attention (gradient accumulated)."""
    N = param_count(arch)
    n = scored_sequences(arch.batch_sequences, load.sample_fraction)
    parts = {
        "weights (16-bit)": 2.0 * N,
        "gradient (fp32)": 4.0 * N,
        "activations": activation_bytes(arch, min(n, arch.micro_batch), eager_attention=False),
    }
    if load.adam:
        parts["m, v (16-bit)"] = 4.0 * N
        parts["AdamW direction u (fp32)"] = 4.0 * N
    return Memory(parts)


def _work_vectors(load: InfluenceLoad) -> int:
    """Full-dimension fp32 vectors ``sketch_chunk`` holds beside the gradient, with the control variate:
    the statistics other than g (S − 1), their stacked copy for one projection (S), the reference's unit
    directions (S) and the running sums for the next reference (S)."""
    S = load.statistics
    return (S - 1) + 3 * S


def actor_memory_as_coded(arch: Architecture, load: InfluenceLoad) -> Memory:
    """A full-replica actor as ``InfluenceWorker`` runs today: float32 model and m, v, all n sequences in
    one eager-attention float32 forward, the control variate's vectors and the SJLT index cache."""
    N = param_count(arch)
    n = scored_sequences(arch.batch_sequences, load.sample_fraction)
    parts = {
        "weights (fp32)": 4.0 * N,
        "gradient (fp32)": 4.0 * N,
        "work vectors (fp32)": 4.0 * N * _work_vectors(load),
        "sjlt cache": min(load.sjlt_cache_bytes, _SJLT_CACHE_BYTES_PER_NONZERO * load.sjlt_s * N),
        "activations": activation_bytes(arch, n, eager_attention=True, bytes_per_value=4),
    }
    if load.adam:
        parts["m, v (fp32)"] = 8.0 * N
    return Memory(parts)


@dataclass(frozen=True, kw_only=True)
class SnapshotPlan:
    """Snapshot mode at W trainer ranks: the fewest actors (one GPU each) that keep wait ≤ target."""

    bytes_per_chunk: float
    publish_sec: float
    batch_sec: float
    chunk_train_sec: float
    memory_floor: Memory
    memory_as_coded: Memory
    actors: int | None
    """Fewest actors G ≤ L with wait ≤ target and a fitting floor memory; None when none."""
    scoring_actors: int | None
    """Fewest actors whose scoring alone is in time (t_score(G) ≤ (1 + target)·t_chunk), the publish aside:
    the influence GPUs needed once publishing leaves the trainers' critical path."""
    wait_fraction: float
    """wait / t_chunk at ``actors`` (else at ``scoring_actors``, else at G = L)."""
    busy_fraction: float
    """t_score(G) / t_chunk: the share of each chunk an actor works; with one actor below 1, a fractional GPU
    of that size would do."""
    reason: str


def snapshot_plan(arch: Architecture, load: InfluenceLoad, dev: DeviceConstants, ranks: int) -> SnapshotPlan:
    """Search G = 1..L (more actors than batches cannot help) for the smallest that meets the target."""
    chunk = load.L * train_step_sec(arch, dev, ranks)
    floor = actor_memory_floor(arch, load)
    publish = snapshot_publish_sec(arch, load, dev, ranks)
    candidates = range(1, load.L + 1)
    chosen = next((G for G in candidates if snapshot_wait_sec(arch, load, dev, ranks, G) <= load.wait_target * chunk),
                  None)
    scoring = next((G for G in candidates
                    if snapshot_score_sec(arch, load, dev, G) <= (1 + load.wait_target) * chunk), None)
    reason = ""
    if floor.total > dev.memory_bytes:
        chosen = scoring = None
        reason = f"an actor needs {floor.total / 2**30:.0f} GiB > {dev.memory_bytes / 2**30:.0f} GiB"
    elif publish > load.wait_target * chunk:
        reason = f"publishing alone is {publish / chunk:.1%} of a chunk"
    elif chosen is None:
        reason = f"{load.L} actors still finish late"
    G = chosen or scoring or load.L
    return SnapshotPlan(
        bytes_per_chunk=snapshot_bytes(arch, load), publish_sec=publish,
        batch_sec=influence_batch_sec(arch, load, dev), chunk_train_sec=chunk, memory_floor=floor,
        memory_as_coded=actor_memory_as_coded(arch, load), actors=chosen, scoring_actors=scoring,
        wait_fraction=snapshot_wait_sec(arch, load, dev, ranks, G) / chunk,
        busy_fraction=snapshot_score_sec(arch, load, dev, G) / chunk, reason=reason,
    )


# ---- in-trainer (sharded) mode ------------------------------------------------------------------------
def kvector_bytes(load: InfluenceLoad) -> float:
    """The chunk's all-reduce payload: statistics × L × (k + control-variate columns) float32."""
    return 4.0 * load.statistics * load.L * (load.k + load.control_variate_columns)


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


def in_trainer_wait_sec(arch: Architecture, load: InfluenceLoad, dev: DeviceConstants, ranks: int,
                        sequences: int | None = None) -> float:
    """Trainer wait per chunk: per gather group max(compute, traffic) (ZeRO-3 prefetch overlaps them), the
    O(N/W) work of every batch, one all-reduce of the k-vectors."""
    n = scored_sequences(arch.batch_sequences, load.sample_fraction) if sequences is None else sequences
    compute = _fwd_bwd_sec(arch, dev, n, ranks)  # one batch's n sequences over W ranks
    gather = _gather_sec(arch, dev, ranks)
    scoring = sum(max(size * compute, gather) for size in _groups(load))
    coords = load.L * dev.coordinate_sec * param_count(arch) / ranks
    return scoring + coords + allreduce_sec(kvector_bytes(load), ranks, dev)


def in_trainer_extra_memory(arch: Architecture, load: InfluenceLoad, ranks: int) -> Memory:
    """Per-rank memory beyond training: the fp32 gradient shard, the work vectors' shards (as coded) and
    the SJLT cache of the shard. Weights, m and v are the trainer's own shards; the n/W sequences' activations
    reuse training's when n/W is at most the training micro-batch."""
    shard = param_count(arch) / ranks
    return Memory({
        "gradient shards (fp32)": 4.0 * shard * load.batches_per_gather,
        "work vectors (fp32)": 4.0 * shard * _work_vectors(load),
        "sjlt cache": min(load.sjlt_cache_bytes, _SJLT_CACHE_BYTES_PER_NONZERO * load.sjlt_s * shard),
    })


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
    coords = load.L * dev.coordinate_sec * param_count(arch) / ranks
    if lo == 0 and gathers > budget:
        reason = f"the ZeRO-3 gathers alone take {gathers / chunk:.1%} of a chunk"
    elif lo == 0 and coords > budget:
        reason = f"the O(N/W) work per batch alone takes {coords / chunk:.1%} of a chunk"
    elif lo == 0:
        reason = f"one sequence per batch already takes {in_trainer_wait_sec(arch, load, dev, ranks, 1) / chunk:.1%}"
    return InTrainerPlan(
        kvector_bytes_per_chunk=kvector_bytes(load),
        zero3_bytes_per_chunk=len(_groups(load)) * zero3_bytes_per_batch(arch) * (ranks - 1) / ranks,
        extra_memory=in_trainer_extra_memory(arch, load, ranks), chunk_train_sec=chunk, wait_sec=wait,
        wait_fraction=wait / chunk, max_sample_fraction=lo / arch.batch_sequences if lo else None, reason=reason,
    )
