"""The capacity model of D3's influence stage: memory, bytes and time per chunk, in both placements.

Pure functions of an :class:`~d3ray.bench.capacity_arch.Architecture`, the influence knobs
(:class:`InfluenceLoad`) and the constants of a device (:class:`DeviceConstants`: measured on this
machine, projected for GPUs, or measured on a GPU by ``bench/gpu_check.sh``). Context: issues 15, 27
("Speed") and 29 (item 4), ARCHITECTURE.md "Influence at scale". Symbols: N parameters, B sequences per
batch, T tokens per sequence, L batches per chunk, s = sample_fraction, n = max(1, round(s·B)) scored
sequences per batch (``d3ray.influence.worker.sample_rows``), W trainer ranks, G influence actors, S
sketched statistics, k sketch size, σ SJLT nonzeros per coordinate, bw_mem the device's memory bandwidth
for elementwise work.

Time of one trained chunk (staleness 1: chunk c+1 is scored while chunk c trains):

    t_step = F·B·T / (W·peak·mfu_train),   F = 6·N_mm + 12·l·h·T (PaLM appendix B),   t_chunk = L·t_step

One scored batch = one forward+backward of n sequences, then O(N) elementwise work whose bytes of memory
traffic per coordinate (c_b) are counted from the code, fp32 tensors (4 bytes), float64 where it casts:

    t_batch(ranks) = F·n·T / (ranks·peak·mfu_influence) + c_b·N / (ranks·bw_mem)

The default estimator, ``drift`` with ``residual: none`` (``d3ray.influence.chunk.sketch_chunk``): per batch
the gradient g_i (the forward+backward) and f_i = ⟨g_i, w⟩ (``drift.batch_potential``: g and w cast to
float64, read 4 + write 8 bytes each, then a dot that reads 16): c_b = 40. Nothing is sketched: no AdamW
direction, no projection, no control variate, no running sums. Once per chunk per actor the drift
w = λθ + β1·m ⊘ (b1·(√(β2·v/b2) + ε)) (``drift.drift_direction``: 9 elementwise ops, 80 bytes per coordinate).

The sketched estimators (``first_order``; ``drift`` with ``residual: sketch``), as coded, per batch:

    AdamW direction u (``adamw_direction``: clip norm in float64 36, clip 8, m 28, v 40, u 64)   176
    drift residual s = u − w (drift with residual: sketch)                                          12
    stacked copy of the S statistics (``torch.cat``)                                                8·S
    SJLT projection (``SparseJLSketch.project``): read the S rows and σ cached values, write and
    re-read the S·σ products, read σ int64 rows                                          4S + 12σ + 8Sσ
    hashing where the index cache (``sjlt_cache_bytes``, 12σ bytes a coordinate) does not reach:
    ~50 int64 element reads/writes per nonzero (``rows_and_signs``, splitmix64), on the device   24 + 390σ
    control variate, pair (u, g): 5 full-dimension dots of 16 bytes (g alone: 1)                 80
    running sums for the next reference (``return_means``)                                        12·S

first_order + adam at σ = 4 (cached): 176 + 16 + 120 + 80 + 24 = 416 bytes a coordinate per batch.

Snapshot mode (trainer rank 0 publishes, synchronously (``d3ray.train.loop.publish_snapshot``); influence
actors with a full replica each score whole batches). What travels, as ``d3ray.train.snapshot`` ships it:

    snapshot = b·(N + V·h if the embedding is tied) + 2·b·N with adam      (b = 2: bfloat16, the default;
               the state dict carries a tied lm_head twice; m, v once per parameter)
    t_publish = 2N·(W−1)/W / bw_coll(W)                      ZeRO-3 gather of the 16-bit weights to rank 0
              + t_allreduce(8N)                              fp32 m, v assembled per parameter (ZeRO 1-3)
              + (2·(N + tied V·h) + 8N) / bw_d2h             16-bit weights; m, v cross in fp32 and are
                                                             converted on the host (blocking ``.to``)
              + snapshot / bw_put                            ``ray.put``
    t_fetch(G) = ⌈G/D⌉·snapshot / bw_object + snapshot / bw_get + (4N + 8N) / bw_h2d + 80N / bw_mem
                 (one pull per node of D devices; the actor widens weights and m, v to fp32 on the host,
                 so 12 bytes a parameter cross PCIe (``load_weights``, ``AdamWState.tensors``); then w)
    t_score(G) = t_fetch(G) + ⌈L/G⌉·t_batch(1)
    wait = t_publish + max(0, t_score(G) − t_chunk)

(with a sketched estimator and the control variate the reference's S fp32 directions travel too: 4·S·N
bytes through the object store and PCIe per chunk.)

In-trainer (sharded) mode: the W ranks score chunk c+1 on their ZeRO-3 shards between chunks, so all of
it is trainer wait. A ZeRO-3 forward+backward all-gathers the 16-bit parameters twice and
reduce-scatters 16-bit gradients (Rajbhandari et al. 2020, ZeRO §7: 3× the model's bytes), whatever n:

    t_gather = 6·N·(W−1)/W / bw_coll(W),   t_fb = F·n·T / (W·peak·mfu_in_trainer)   (the engine's 16-bit module)
    wait = Σ_groups max(g·t_fb, t_gather) + L·c_b·N/(W·bw_mem) + (80 + 16)·N/(W·bw_mem)
           + L·(one scalar all-reduce for f_i [+ the (S, k) projection's all-reduce when sketched])
    t_allreduce(bytes) = 2·(W−1)/W · bytes / bw_coll(W) + 2·⌈log2 W⌉·latency  (ring bandwidth, tree latency)

(the 16: ``AdamWState.tensors`` copies the rank's m, v slices once per chunk), with g =
``batches_per_gather`` batches per parameter gather (1: a forward+backward per batch, as the trainers'
engine runs it; L: each layer gathered once per chunk). Both modes target wait / t_chunk ≤ 2% (issue 15).

Memory (bytes; activations from ``capacity_arch.activation_bytes``):

    actor floor    = 2N weights + 4N gradient + activations of min(n, micro-batch) sequences, 16-bit, flash
                     drift: + 4N w (built tensor by tensor from the 16-bit m, v);
                     sketched: + 4N m, v in 16-bit + 4N u with adam
    actor as coded = 4N weights + 4N gradient [+ 8N m, v] + activations of all n sequences at once, float32,
                     SDPA (the trainers' flash_attention_2 runs as SDPA in the fp32 worker)
                     drift: + 4N w + 16 × the largest tensor (its float64 casts);
                     sketched: + 4N·(S − 1 + 3S) work vectors (with the control variate) + the SJLT cache
    in-trainer extra per rank = 4N/W·g gradient shards [+ 8N/W m, v copies] (drift: + 4N/W w;
                     sketched: + 4N/W·(S − 1 + 3S) work vectors + SJLT cache of N/W)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from d3ray.bench.capacity_arch import (
    Architecture,
    activation_bytes,
    largest_tensor,
    param_count,
    tied_copy,
    train_flops_per_token,
)

__all__ = [
    "ESTIMATORS",
    "ChunkCost",
    "DeviceConstants",
    "InTrainerPlan",
    "InfluenceLoad",
    "Memory",
    "SnapshotPlan",
    "actor_memory_as_coded",
    "actor_memory_floor",
    "allreduce_sec",
    "batch_coordinate_bytes",
    "chunk_cost",
    "chunk_coordinate_bytes",
    "host_to_device_bytes",
    "in_trainer_extra_memory",
    "in_trainer_plan",
    "in_trainer_wait_sec",
    "influence_batch_sec",
    "kvector_bytes",
    "publish_device_to_host_bytes",
    "scored_sequences",
    "snapshot_bytes",
    "snapshot_fetch_sec",
    "snapshot_plan",
    "snapshot_publish_sec",
    "snapshot_score_sec",
    "snapshot_wait_sec",
    "train_step_sec",
    "zero3_bytes_per_batch",
]

#: ``drift``: the exact potential alone (the default, ``residual: none``); ``drift_sketch``: plus the
#: sketched residual (``residual: sketch``); ``first_order``: the sketched first-order S.
ESTIMATORS = ("drift", "drift_sketch", "first_order")

# Bytes of memory traffic per coordinate, counted from the code (module docstring).
POTENTIAL_BYTES = 40.0
"""``batch_potential``: g and w cast to float64 (read 4, write 8 each), the dot reads 16."""
DRIFT_BYTES = 80.0
"""``drift_direction``, once per chunk: 7 one-input ops (read 4, write 4) and 2 two-input ops (read 8, write 4)."""
MOMENTS_COPY_BYTES = 16.0
"""``AdamWState.tensors`` on the device (in-trainer): m and v slices copied to fp32 (read 4, write 4 each)."""
ADAMW_DIRECTION_BYTES = 176.0
"""``adamw_direction``: clip norm in float64 36, clip 8, m 28, v 40, u 64."""
DRIFT_RESIDUAL_BYTES = 12.0
"""``drift_residual``: s = u − w (read 8, write 4)."""
CV_DOT_BYTES = 16.0
"""One full-dimension dot of the control variate: the product (read 8, write 4) and its sum (read 4)."""
SJLT_CACHE_BYTES_PER_NONZERO = 12
"""An int64 row index and a float32 signed value per SJLT nonzero in the sketch's cache."""


def projection_bytes(stats: int, nonzeros: int) -> float:
    """``SparseJLSketch.project`` of S stacked rows, cached indices: 4S + 12σ + 8Sσ bytes per coordinate."""
    return 4.0 * stats + 12.0 * nonzeros + 8.0 * stats * nonzeros


def hash_bytes(nonzeros: int) -> float:
    """``rows_and_signs`` of one coordinate on the device (int64 tensors of σ columns): 24 + 390σ bytes."""
    return 24.0 + 390.0 * nonzeros


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
    """Fraction of ``peak_flops`` an influence actor's forward+backward of n sequences reaches (the worker
    computes in ``InfluenceConfig.dtype``, float32)."""
    mfu_in_trainer: float | None = None
    """The same on the trainers' ZeRO-3 module (in-trainer mode: the engine's 16-bit weights); None = mfu_influence."""
    memory_bytes_per_sec: float
    """bw_mem: bytes read + written per second by the O(N) elementwise influence work."""
    put_bytes_per_sec: float
    """``ray.put`` of the snapshot on the publishing host."""
    get_bytes_per_sec: float
    """``ray.get`` of the snapshot in an actor's process and its widening to fp32 on the host (shipped bytes/s)."""
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
        for name in ("memory_bytes", "peak_flops", "mfu_train", "mfu_influence", "memory_bytes_per_sec",
                     "put_bytes_per_sec", "get_bytes_per_sec", "host_device_bytes_per_sec", "object_bytes_per_sec",
                     "intra_node_bytes_per_sec", "inter_node_bytes_per_sec"):
            if not getattr(self, name) > 0:
                raise ValueError(f"DeviceConstants.{name} must be > 0, got {getattr(self, name)}")
        if self.mfu_in_trainer is not None and not self.mfu_in_trainer > 0:
            raise ValueError(f"DeviceConstants.mfu_in_trainer must be > 0, got {self.mfu_in_trainer}")
        if self.collective_latency_sec < 0 or self.devices_per_node < 1:
            raise ValueError(f"DeviceConstants {self.name}: negative latency or devices_per_node < 1")

    def collective_bytes_per_sec(self, ranks: int) -> float:
        """Bus bandwidth of a collective over ``ranks`` devices: NVLink inside one node, else the network."""
        return self.intra_node_bytes_per_sec if ranks <= self.devices_per_node else self.inter_node_bytes_per_sec

    @property
    def projected_fields(self) -> list[str]:
        """Fields whose value is a projection (not measured, not a spec sheet)."""
        return sorted(k for k, v in self.provenance.items() if v.startswith("projection"))


@dataclass(frozen=True, kw_only=True)
class InfluenceLoad:
    """The influence knobs that set its cost (``InfluenceConfig``, ``SjltSketchConfig``, ``ScheduleConfig``
    defaults: ``drift`` with ``residual: none``, adam, s = 1/8, L = 8, bfloat16 snapshots)."""

    estimator: str = "drift"
    """One of ``ESTIMATORS``."""
    L: int = 8
    sample_fraction: float = 0.125
    adam: bool = True
    """Preconditioner ``adam``: m and v travel with the weights (the drift needs them)."""
    snapshot_bytes_per_value: int = 2
    """``schedule.snapshot_dtype``: 2 (bfloat16, the default) or 4 (float32)."""
    k: int = 16384
    """Sketch size (sketched estimators only; the sjlt default)."""
    statistics: int = 2
    """Sketched vectors per batch: g and u (first_order + adam) or g and s (drift, residual sketch)."""
    control_variate: bool = True
    control_variate_columns: int = 3
    sjlt_s: int = 4
    sjlt_cache_bytes: float = 2.0**30
    wait_target: float = 0.02
    batches_per_gather: int = 1
    """In-trainer mode: scored batches that share one ZeRO-3 parameter gather. 1: one forward+backward per
    batch; L: every layer gathered once per chunk and run on all L batches' sequences, with per-batch
    gradients of the shard (L gradient shards in memory)."""

    def __post_init__(self) -> None:
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"InfluenceLoad.estimator must be one of {list(ESTIMATORS)}, got {self.estimator!r}")
        if self.estimator != "first_order" and not self.adam:
            raise ValueError("the drift estimators need the AdamW state (adam=True): without it f ≡ 0")
        if self.L < 1 or self.k < 1 or self.statistics < 1 or not 0 < self.sample_fraction <= 1:
            raise ValueError(f"InfluenceLoad needs L, k, statistics >= 1 and 0 < sample_fraction <= 1: {self}")
        if self.snapshot_bytes_per_value not in (2, 4):
            raise ValueError(f"snapshot_bytes_per_value must be 2 or 4, got {self.snapshot_bytes_per_value}")
        if not 1 <= self.batches_per_gather <= self.L:
            raise ValueError(f"batches_per_gather must be in [1, L={self.L}], got {self.batches_per_gather}")
        if not 0 < self.wait_target < 1:
            raise ValueError(f"wait_target must be in (0, 1), got {self.wait_target}")

    @property
    def potential(self) -> bool:
        """f_i = ⟨g_i, w⟩ is computed (the drift estimators)."""
        return self.estimator in ("drift", "drift_sketch")

    @property
    def sketches(self) -> bool:
        """Anything goes through the JL sketch (not the default)."""
        return self.estimator != "drift"

    @property
    def stats(self) -> int:
        """Statistics sketched per batch (0 for the default)."""
        return self.statistics if self.sketches else 0


@dataclass(frozen=True)
class Memory:
    """Bytes by component; ``total`` is their sum."""

    parts: Mapping[str, float]

    @property
    def total(self) -> float:
        return float(sum(self.parts.values()))


# ---- bytes per coordinate -----------------------------------------------------------------------------
def _uncached_fraction(load: InfluenceLoad, params: float) -> float:
    """Share of the coordinates whose SJLT rows are hashed on every projection (beyond the cache)."""
    cached = load.sjlt_cache_bytes / (SJLT_CACHE_BYTES_PER_NONZERO * load.sjlt_s)
    return max(0.0, 1.0 - cached / params) if params > 0 else 0.0


def batch_coordinate_bytes(load: InfluenceLoad, params: float) -> float:
    """c_b: bytes of memory traffic per coordinate per scored batch beyond the forward+backward (docstring)."""
    total = POTENTIAL_BYTES if load.potential else 0.0
    if not load.sketches:
        return total
    S, sigma = load.statistics, load.sjlt_s
    total += ADAMW_DIRECTION_BYTES if load.adam else 0.0
    total += DRIFT_RESIDUAL_BYTES if load.estimator == "drift_sketch" else 0.0
    total += 8.0 * S + projection_bytes(S, sigma) + _uncached_fraction(load, params) * hash_bytes(sigma)
    if load.control_variate:
        total += CV_DOT_BYTES * (5 if load.adam else 1) + 12.0 * S
    return total


def chunk_coordinate_bytes(load: InfluenceLoad, in_trainer: bool = False) -> float:
    """Bytes per coordinate once per chunk on the device: the drift w (+ the m, v copies in-trainer)."""
    if not load.potential:
        return MOMENTS_COPY_BYTES if in_trainer and load.adam else 0.0
    return DRIFT_BYTES + (MOMENTS_COPY_BYTES if in_trainer else 0.0)


# ---- time ---------------------------------------------------------------------------------------------
def scored_sequences(batch_sequences: int, sample_fraction: float) -> int:
    """n = max(1, round(s·B)): the sequences of a batch that are scored (``sample_rows``)."""
    return max(1, int(round(sample_fraction * batch_sequences)))


def train_step_sec(arch: Architecture, dev: DeviceConstants, ranks: int) -> float:
    """t_step = F·B·T / (W·peak·mfu_train)."""
    tokens = arch.batch_sequences * arch.seq_len
    return train_flops_per_token(arch) * tokens / (ranks * dev.peak_flops * dev.mfu_train)


def _fwd_bwd_sec(arch: Architecture, dev: DeviceConstants, sequences: int, ranks: int,
                 in_trainer: bool = False) -> float:
    mfu = dev.mfu_in_trainer if in_trainer and dev.mfu_in_trainer is not None else dev.mfu_influence
    return train_flops_per_token(arch) * sequences * arch.seq_len / (ranks * dev.peak_flops * mfu)


def influence_batch_sec(arch: Architecture, load: InfluenceLoad, dev: DeviceConstants) -> float:
    """t_batch(1): one scored batch on a full-replica actor (forward+backward of n, then c_b·N / bw_mem)."""
    n = scored_sequences(arch.batch_sequences, load.sample_fraction)
    N = param_count(arch)
    return _fwd_bwd_sec(arch, dev, n, 1) + batch_coordinate_bytes(load, N) * N / dev.memory_bytes_per_sec


def allreduce_sec(num_bytes: float, ranks: int, dev: DeviceConstants) -> float:
    """Ring bandwidth term 2·(W−1)/W·bytes/bw plus tree latency 2·⌈log2 W⌉·latency; 0 for one rank."""
    if ranks <= 1:
        return 0.0
    bw = dev.collective_bytes_per_sec(ranks)
    return 2.0 * (ranks - 1) / ranks * num_bytes / bw + 2 * math.ceil(math.log2(ranks)) * dev.collective_latency_sec


# ---- snapshot mode ------------------------------------------------------------------------------------
def snapshot_bytes(arch: Architecture, load: InfluenceLoad) -> float:
    """What ``ray.put`` ships: b·(N + the tied lm_head's second copy) weights, + 2·b·N m, v with adam."""
    N = param_count(arch)
    b = load.snapshot_bytes_per_value
    return b * (N + tied_copy(arch)) + (2.0 * b * N if load.adam else 0.0)


def publish_device_to_host_bytes(arch: Architecture, load: InfluenceLoad) -> float:
    """Rank 0's device→host copy: 16-bit weights (with the tied copy), m and v in fp32 (converted on the host)."""
    N = param_count(arch)
    return 2.0 * (N + tied_copy(arch)) + (8.0 * N if load.adam else 0.0)


def host_to_device_bytes(arch: Architecture, load: InfluenceLoad) -> float:
    """An actor's host→device copy per chunk: weights and m, v widened to fp32 on the host first (12N with
    adam), plus the control variate's S fp32 reference directions when something is sketched."""
    N = param_count(arch)
    reference = 4.0 * load.statistics * N if load.sketches and load.control_variate else 0.0
    return 4.0 * N + (8.0 * N if load.adam else 0.0) + reference


def snapshot_publish_sec(arch: Architecture, load: InfluenceLoad, dev: DeviceConstants, ranks: int) -> float:
    """Trainer-side publish (synchronous): ZeRO-3 gather of the weights, fp32 all-reduce of m and v,
    device→host copy, ``ray.put``."""
    N = param_count(arch)
    gather = 2.0 * N * (ranks - 1) / ranks / dev.collective_bytes_per_sec(ranks) if ranks > 1 else 0.0
    moments = allreduce_sec(8.0 * N, ranks, dev) if load.adam else 0.0
    return (gather + moments + publish_device_to_host_bytes(arch, load) / dev.host_device_bytes_per_sec
            + snapshot_bytes(arch, load) / dev.put_bytes_per_sec)


def snapshot_fetch_sec(arch: Architecture, load: InfluenceLoad, dev: DeviceConstants, actors: int) -> float:
    """Per chunk and actor before its first batch: one pull per actor node (one after the other from the
    publishing node), ``ray.get`` + widening, host→device, the drift w (and the reference when sketched)."""
    nbytes = snapshot_bytes(arch, load)
    reference = 4.0 * load.statistics * param_count(arch) if load.sketches and load.control_variate else 0.0
    nodes = math.ceil(actors / dev.devices_per_node)
    fetch = nodes * (nbytes + reference) / dev.object_bytes_per_sec + nbytes / dev.get_bytes_per_sec
    fetch += host_to_device_bytes(arch, load) / dev.host_device_bytes_per_sec
    return fetch + chunk_coordinate_bytes(load) * param_count(arch) / dev.memory_bytes_per_sec


def snapshot_score_sec(arch: Architecture, load: InfluenceLoad, dev: DeviceConstants, actors: int) -> float:
    """t_score(G) = t_fetch(G) + ⌈L/G⌉·t_batch(1)."""
    return snapshot_fetch_sec(arch, load, dev, actors) + math.ceil(load.L / actors) * influence_batch_sec(arch, load, dev)


def snapshot_wait_sec(arch: Architecture, load: InfluenceLoad, dev: DeviceConstants, ranks: int, actors: int) -> float:
    """Trainer wait per chunk: t_publish + max(0, t_score(G) − t_chunk)."""
    chunk = load.L * train_step_sec(arch, dev, ranks)
    late = max(0.0, snapshot_score_sec(arch, load, dev, actors) - chunk)
    return snapshot_publish_sec(arch, load, dev, ranks) + late


def _work_vectors(load: InfluenceLoad) -> int:
    """Full-dimension fp32 vectors ``sketch_chunk`` holds beside the gradient when sketching: the
    statistics other than g (S − 1), their stacked copy (S), and with the control variate the reference's
    unit directions (S) and the running sums for the next reference (S)."""
    if not load.sketches:
        return 0
    S = load.statistics
    return (S - 1) + S + (2 * S if load.control_variate else 0)


def actor_memory_floor(arch: Architecture, load: InfluenceLoad) -> Memory:
    """Least memory of a full-replica actor: 16-bit weights, fp32 gradient, 16-bit activations of one
    micro-batch with flash attention; drift: fp32 w (built from 16-bit m, v one tensor at a time);
    sketched with adam: 16-bit m, v and the fp32 AdamW direction u."""
    N = param_count(arch)
    n = scored_sequences(arch.batch_sequences, load.sample_fraction)
    parts = {
        "weights (16-bit)": 2.0 * N,
        "gradient (fp32)": 4.0 * N,
        "activations": activation_bytes(arch, min(n, arch.micro_batch), eager_attention=False),
    }
    if load.potential:
        parts["drift w (fp32)"] = 4.0 * N
    if load.sketches and load.adam:
        parts["m, v (16-bit)"] = 4.0 * N
        parts["AdamW direction u (fp32)"] = 4.0 * N
    return Memory(parts)


def actor_memory_as_coded(arch: Architecture, load: InfluenceLoad) -> Memory:
    """A full-replica actor as ``InfluenceWorker`` runs today: float32 model, gradient and m, v (widened
    copies, held for the call), all n sequences in one float32 SDPA forward; drift: w and the float64
    casts of the largest tensor; sketched: the work vectors and the SJLT index cache."""
    N = param_count(arch)
    n = scored_sequences(arch.batch_sequences, load.sample_fraction)
    parts = {
        "weights (fp32)": 4.0 * N,
        "gradient (fp32)": 4.0 * N,
        "activations": activation_bytes(arch, n, eager_attention=False, bytes_per_value=4),
    }
    if load.adam:
        parts["m, v (fp32)"] = 8.0 * N
    if load.potential:
        parts["drift w (fp32)"] = 4.0 * N
        parts["float64 casts of g, w (largest tensor)"] = 16.0 * largest_tensor(arch)
    if load.sketches:
        parts["work vectors (fp32)"] = 4.0 * N * _work_vectors(load)
        parts["sjlt cache"] = min(load.sjlt_cache_bytes, SJLT_CACHE_BYTES_PER_NONZERO * load.sjlt_s * N)
    return Memory(parts)


@dataclass(frozen=True, kw_only=True)
class ChunkCost:
    """One chunk of the default snapshot placement, phase by phase (seconds), and the actor's share."""

    step_sec: float
    """t_step at W trainer ranks."""
    chunk_train_sec: float
    publish_sec: float
    """Trainer side (synchronous): gather, m/v all-reduce, device→host, ``ray.put``."""
    transfer_sec: float
    """Actor side: object pull + ``ray.get`` + widening to fp32 (one actor node)."""
    host_to_device_sec: float
    drift_sec: float
    """w built once (the drift estimators)."""
    fwd_bwd_sec: float
    """Per batch: the forward+backward of the n scored sequences."""
    coordinate_sec: float
    """Per batch: the O(N) work (the potential's dot; with a sketch, also direction, projection, ...)."""
    batch_sec: float
    actor_sec: float
    """One actor, the whole chunk: transfer + host→device + w + L·batch."""
    actor_share: float
    """actor_sec / chunk_train_sec: the influence GPUs' busy share of one chunk (< 1: one actor keeps up)."""
    batch_step_ratio: float
    """batch_sec / step_sec: one scored batch on one GPU against one training step on W."""
    gpu_seconds_ratio: float
    """actor_sec / (W · chunk_train_sec): influence GPU-seconds per training GPU-second."""


def chunk_cost(arch: Architecture, load: InfluenceLoad, dev: DeviceConstants, ranks: int) -> ChunkCost:
    """The per-chunk breakdown of one full-replica actor scoring all L batches (G = 1)."""
    N = param_count(arch)
    n = scored_sequences(arch.batch_sequences, load.sample_fraction)
    step = train_step_sec(arch, dev, ranks)
    nbytes = snapshot_bytes(arch, load)
    reference = 4.0 * load.statistics * N if load.sketches and load.control_variate else 0.0
    transfer = (nbytes + reference) / dev.object_bytes_per_sec + nbytes / dev.get_bytes_per_sec
    h2d = host_to_device_bytes(arch, load) / dev.host_device_bytes_per_sec
    drift = chunk_coordinate_bytes(load) * N / dev.memory_bytes_per_sec
    fb = _fwd_bwd_sec(arch, dev, n, 1)
    coords = batch_coordinate_bytes(load, N) * N / dev.memory_bytes_per_sec
    actor = transfer + h2d + drift + load.L * (fb + coords)
    chunk = load.L * step
    return ChunkCost(
        step_sec=step, chunk_train_sec=chunk, publish_sec=snapshot_publish_sec(arch, load, dev, ranks),
        transfer_sec=transfer, host_to_device_sec=h2d, drift_sec=drift, fwd_bwd_sec=fb, coordinate_sec=coords,
        batch_sec=fb + coords, actor_sec=actor, actor_share=actor / chunk, batch_step_ratio=(fb + coords) / step,
        gpu_seconds_ratio=actor / (ranks * chunk),
    )


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
    """The O(N/W) work of a chunk on each rank: L batches' c_b and the chunk's w (+ m, v copies)."""
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
    compute = _fwd_bwd_sec(arch, dev, n, ranks, in_trainer=True)  # one batch's n sequences over W ranks
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
    if load.sketches:
        parts["work vectors (fp32)"] = 4.0 * shard * _work_vectors(load)
        parts["sjlt cache"] = min(load.sjlt_cache_bytes, SJLT_CACHE_BYTES_PER_NONZERO * load.sjlt_s * shard)
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
