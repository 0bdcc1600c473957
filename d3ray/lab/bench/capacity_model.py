"""The capacity model of D3's influence stage: its inputs and the per-batch terms both placements share.

Pure functions of an :class:`~d3ray.lab.bench.capacity_arch.Architecture`, the influence knobs
(:class:`InfluenceLoad`) and the constants of a device (:class:`DeviceConstants`: measured on this
machine, projected for GPUs, or measured on a GPU by ``bench/gpu_check.sh``). Context: issues 15, 27
("Speed") and 29 (item 4), docs/design/system.md §5. Symbols: N parameters, B sequences per
batch, T tokens per sequence, L batches per chunk, s = sample_fraction, n = max(1, round(s·B)) scored
sequences per batch (``d3ray.influence.worker.sample_rows``), W trainer ranks, G influence actors, S
sketched statistics, k sketch size, σ SJLT nonzeros per coordinate, bw_mem the device's memory bandwidth
for elementwise work. The two placements build on these terms: :mod:`d3ray.lab.bench.capacity_snapshot`
(influence actors with a full replica each, the default) and :mod:`d3ray.lab.bench.capacity_in_trainer`
(the trainer ranks score on their ZeRO-3 shards). Both target wait / t_chunk ≤ 2% (issue 15).

Time of one trained chunk (staleness 1: chunk c+1 is scored while chunk c trains):

    t_step = F·B·T / (W·peak·mfu_train),   F = 6·N_mm + 12·l·h·T (PaLM appendix B),   t_chunk = L·t_step

One scored batch = one forward+backward of n sequences, then O(N) elementwise work whose bytes of memory
traffic per coordinate (c_b) are counted from the code, fp32 tensors (4 bytes), float64 where it casts:

    t_batch(ranks) = F·n·T / (ranks·peak·mfu_influence) + c_b·N / (ranks·bw_mem)

The default estimator, ``drift`` with ``residual: none``, on influence actors (``potential: step``,
``d3ray.influence.chunk.potential_chunk``): per batch two forwards of its n sequences (stacked with the
call's other batches), at θ and at θ − η·w, each F/3 of the forward+backward's flops (F = 6·N_mm + 12·l·h·T
is 2·N_mm + 4·l·h·T forward and twice that backward), so 2/3 of F·n·T, and no O(N) work per batch
(c_b = 0: f_i comes out of the two losses). Once per call θ − η·w is written (read 8, write 4: 12 bytes a
coordinate). With ``potential: gradient`` (``InfluenceLoad.potential_method``; always in-trainer): the gradient
g_i (the forward+backward) and f_i = ⟨g_i, w⟩ (``drift.batch_potential``: g and w cast to float64, read
4 + write 8 bytes each, then a dot that reads 16): c_b = 40. Nothing is sketched either way: no AdamW
direction, no projection, no control variate, no running sums. Once per chunk per actor the drift
w = λθ + β1·m ⊘ (b1·(√(β2·v/b2) + ε)) (``drift.drift_direction``: 9 elementwise ops, 80 bytes per coordinate).
Memory is priced as ``gradient``'s for both (θ − η·w takes the gradient's 4·N; one forward's
activations are fewer than a forward+backward's): an upper bound for ``step``.

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

A collective over W ranks (ring bandwidth, tree latency):

    t_allreduce(bytes) = 2·(W−1)/W · bytes / bw_coll(W) + 2·⌈log2 W⌉·latency
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from d3ray.lab.bench.capacity_arch import Architecture, param_count, train_flops_per_token

__all__ = [
    "ESTIMATORS",
    "SJLT_CACHE_BYTES_PER_NONZERO",
    "DeviceConstants",
    "InfluenceLoad",
    "Memory",
    "allreduce_sec",
    "batch_coordinate_bytes",
    "chunk_coordinate_bytes",
    "fwd_bwd_sec",
    "influence_batch_sec",
    "scored_sequences",
    "scoring_compute_sec",
    "sketch_work_memory",
    "train_step_sec",
    "work_vectors",
]

#: sketched residual (``residual: sketch``); ``first_order``: the sketched first-order S.
ESTIMATORS = ("drift", "drift_sketch", "first_order")

# Bytes of memory traffic per coordinate, counted from the code (module docstring).
POTENTIAL_BYTES = 40.0
"""``batch_potential``: g and w cast to float64 (read 4, write 8 each), the dot reads 16."""
DRIFT_BYTES = 80.0
"""``drift_direction``, once per chunk: 7 one-input ops (read 4, write 4) and 2 two-input ops (read 8, write 4)."""
STEP_PARAMS_BYTES = 12.0
"""``batched_potentials`` (``potential: step``), once per call: θ − η·w (read 8, write 4)."""
STEP_FLOP_SHARE = 2.0 / 3.0
"""Two forwards (θ and θ − η·w) against one forward+backward: 2·(F/3) / F."""
#: how the actors get f_i with the default drift estimator (``DriftConfig.potential``; jvp is not priced)
POTENTIALS = ("step", "gradient")
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
    """``schedule.placement.snapshot_dtype``: 2 (bfloat16, the default) or 4 (float32)."""
    k: int = 16384
    """Sketch size (sketched estimators only; the sjlt default)."""
    statistics: int = 2
    """Sketched vectors per batch: g and u (first_order + adam) or g and s (drift, residual sketch)."""
    control_variate: bool = True
    control_variate_columns: int = 3
    sjlt_s: int = 4
    sjlt_cache_bytes: float = 2.0**30
    wait_target: float = 0.02
    potential_method: str = "step"
    """``DriftConfig.potential`` of the actors (``drift`` only): ``step`` (the default: two batched forwards,
    no O(N) work per batch) or ``gradient`` (a forward+backward and ⟨g_i, w⟩). In-trainer scoring always
    takes the gradient (``capacity_in_trainer``)."""
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
        if self.potential_method not in POTENTIALS:
            raise ValueError(f"InfluenceLoad.potential_method must be one of {list(POTENTIALS)}, "
                             f"got {self.potential_method!r}")

    @property
    def potential(self) -> bool:
        """f_i = ⟨g_i, w⟩ is computed (the drift estimators)."""
        return self.estimator in ("drift", "drift_sketch")

    @property
    def steps_potential(self) -> bool:
        """f_i from two batched forwards (``drift`` with ``potential: step``), not from a gradient."""
        return self.estimator == "drift" and self.potential_method == "step"

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
    if load.steps_potential:
        return 0.0  # f_i comes out of the two forwards' losses
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
    """Bytes per coordinate once per chunk on the device: the drift w (+ the m, v copies in-trainer; + θ − η·w
    on an actor with ``potential: step``)."""
    if not load.potential:
        return MOMENTS_COPY_BYTES if in_trainer and load.adam else 0.0
    if in_trainer:
        return DRIFT_BYTES + MOMENTS_COPY_BYTES
    return DRIFT_BYTES + (STEP_PARAMS_BYTES if load.steps_potential else 0.0)


# ---- time ---------------------------------------------------------------------------------------------
def scored_sequences(batch_sequences: int, sample_fraction: float) -> int:
    """n = max(1, round(s·B)): the sequences of a batch that are scored (``sample_rows``)."""
    return max(1, int(round(sample_fraction * batch_sequences)))


def train_step_sec(arch: Architecture, dev: DeviceConstants, ranks: int) -> float:
    """t_step = F·B·T / (W·peak·mfu_train)."""
    tokens = arch.batch_sequences * arch.seq_len
    return train_flops_per_token(arch) * tokens / (ranks * dev.peak_flops * dev.mfu_train)


def fwd_bwd_sec(arch: Architecture, dev: DeviceConstants, sequences: int, ranks: int,
                 in_trainer: bool = False) -> float:
    """F·n·T / (W·peak·mfu): the forward+backward of ``sequences`` over ``ranks`` (the influence actor's
    mfu, or the trainers' ZeRO-3 module's when ``in_trainer``)."""
    mfu = dev.mfu_in_trainer if in_trainer and dev.mfu_in_trainer is not None else dev.mfu_influence
    return train_flops_per_token(arch) * sequences * arch.seq_len / (ranks * dev.peak_flops * mfu)


def scoring_compute_sec(arch: Architecture, load: InfluenceLoad, dev: DeviceConstants) -> float:
    """One scored batch's model compute on a full-replica actor: the forward+backward of its n sequences, or
    2/3 of it for ``potential: step`` (two forwards)."""
    n = scored_sequences(arch.batch_sequences, load.sample_fraction)
    return fwd_bwd_sec(arch, dev, n, 1) * (STEP_FLOP_SHARE if load.steps_potential else 1.0)


def influence_batch_sec(arch: Architecture, load: InfluenceLoad, dev: DeviceConstants) -> float:
    """t_batch(1): one scored batch on a full-replica actor (its compute, then c_b·N / bw_mem)."""
    N = param_count(arch)
    return scoring_compute_sec(arch, load, dev) + batch_coordinate_bytes(load, N) * N / dev.memory_bytes_per_sec


def allreduce_sec(num_bytes: float, ranks: int, dev: DeviceConstants) -> float:
    """Ring bandwidth term 2·(W−1)/W·bytes/bw plus tree latency 2·⌈log2 W⌉·latency; 0 for one rank."""
    if ranks <= 1:
        return 0.0
    bw = dev.collective_bytes_per_sec(ranks)
    return 2.0 * (ranks - 1) / ranks * num_bytes / bw + 2 * math.ceil(math.log2(ranks)) * dev.collective_latency_sec


def work_vectors(load: InfluenceLoad) -> int:
    """Full-dimension fp32 vectors ``sketch_chunk`` holds beside the gradient when sketching: the
    statistics other than g (S − 1), their stacked copy (S), and with the control variate the reference's
    unit directions (S) and the running sums for the next reference (S)."""
    if not load.sketches:
        return 0
    S = load.statistics
    return (S - 1) + S + (2 * S if load.control_variate else 0)


def sketch_work_memory(load: InfluenceLoad, coordinates: float) -> dict[str, float]:
    """Memory of the sketching over ``coordinates`` (a full replica or one rank's shard): the fp32 work
    vectors (:func:`work_vectors`) and the SJLT index cache, capped at ``sjlt_cache_bytes``; empty for
    the default estimator."""
    if not load.sketches:
        return {}
    return {"work vectors (fp32)": 4.0 * coordinates * work_vectors(load),
            "sjlt cache": min(load.sjlt_cache_bytes, SJLT_CACHE_BYTES_PER_NONZERO * load.sjlt_s * coordinates)}
