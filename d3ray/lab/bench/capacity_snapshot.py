"""The capacity model's snapshot placement (the default): trainer rank 0 publishes, actors score.

Trainer rank 0 publishes, synchronously (``d3ray.train.scheduling.trainer_side.publish_snapshot``); influence actors with a
full replica each score whole batches. Built on the shared terms of :mod:`d3ray.lab.bench.capacity_model`
(the symbols, t_step, t_batch(ranks), c_b and t_allreduce are defined there). What travels, as ``d3ray.train.scheduling.snapshot`` ships it:

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

Memory of one actor (bytes; activations from ``capacity_arch.activation_bytes``):

    actor floor    = 2N weights + 4N gradient + activations of min(n, micro-batch) sequences, 16-bit, flash
                     drift: + 4N w (built tensor by tensor from the 16-bit m, v);
                     sketched: + 4N m, v in 16-bit + 4N u with adam
    actor as coded = 4N weights + 4N gradient [+ 8N m, v] + activations of all n sequences at once, float32,
                     SDPA (the trainers' flash_attention_2 runs as SDPA in the fp32 worker)
                     drift: + 4N w + 16 × the largest tensor (its float64 casts);
                     sketched: + 4N·(S − 1 + 3S) work vectors (with the control variate) + the SJLT cache
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from d3ray.lab.bench.capacity_arch import (
    Architecture,
    activation_bytes,
    largest_tensor,
    param_count,
    tied_copy,
)
from d3ray.lab.bench.capacity_model import (
    DeviceConstants,
    InfluenceLoad,
    Memory,
    allreduce_sec,
    batch_coordinate_bytes,
    chunk_coordinate_bytes,
    influence_batch_sec,
    scored_sequences,
    scoring_compute_sec,
    sketch_work_memory,
    train_step_sec,
)

__all__ = [
    "ChunkCost",
    "SnapshotPlan",
    "actor_memory_as_coded",
    "actor_memory_floor",
    "chunk_cost",
    "host_to_device_bytes",
    "publish_device_to_host_bytes",
    "reference_bytes",
    "snapshot_bytes",
    "snapshot_fetch_sec",
    "snapshot_plan",
    "snapshot_publish_sec",
    "snapshot_score_sec",
    "snapshot_wait_sec",
]


def snapshot_bytes(arch: Architecture, load: InfluenceLoad) -> float:
    """What ``ray.put`` ships: b·(N + the tied lm_head's second copy) weights, + 2·b·N m, v with adam."""
    N = param_count(arch)
    b = load.snapshot_bytes_per_value
    return b * (N + tied_copy(arch)) + (2.0 * b * N if load.adam else 0.0)


def publish_device_to_host_bytes(arch: Architecture, load: InfluenceLoad) -> float:
    """Rank 0's device→host copy: 16-bit weights (with the tied copy), m and v in fp32 (converted on the host)."""
    N = param_count(arch)
    return 2.0 * (N + tied_copy(arch)) + (8.0 * N if load.adam else 0.0)


def reference_bytes(arch: Architecture, load: InfluenceLoad) -> float:
    """The control variate's S fp32 reference directions that travel with each chunk's snapshot (through
    the object store and PCIe) when something is sketched; 0 for the default estimator."""
    return 4.0 * load.statistics * param_count(arch) if load.sketches and load.control_variate else 0.0


def host_to_device_bytes(arch: Architecture, load: InfluenceLoad) -> float:
    """An actor's host→device copy per chunk: weights and m, v widened to fp32 on the host first (12N with
    adam), plus the control variate's S fp32 reference directions when something is sketched."""
    N = param_count(arch)
    return 4.0 * N + (8.0 * N if load.adam else 0.0) + reference_bytes(arch, load)


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
    reference = reference_bytes(arch, load)
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
    parts.update(sketch_work_memory(load, N))
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
    """Per batch: the model compute of the n scored sequences (forward+backward; two forwards, 2/3 of it,
    for ``potential: step``)."""
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
    step = train_step_sec(arch, dev, ranks)
    nbytes = snapshot_bytes(arch, load)
    reference = reference_bytes(arch, load)
    transfer = (nbytes + reference) / dev.object_bytes_per_sec + nbytes / dev.get_bytes_per_sec
    h2d = host_to_device_bytes(arch, load) / dev.host_device_bytes_per_sec
    drift = chunk_coordinate_bytes(load) * N / dev.memory_bytes_per_sec
    fb = scoring_compute_sec(arch, load, dev)
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
