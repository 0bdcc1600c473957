"""Device constants for the capacity model: this machine measured, GPUs projected or measured.

Three sources, each number tagged in ``DeviceConstants.provenance``:

- ``cpu_constants``: everything measured here by :mod:`d3ray.lab.bench.capacity_measure` (the FLOP/s a
  training step and the influence forward+backward reach, memory copy bandwidth, ``ray.put``/``get``, gloo).
- ``projected_gpu``: spec-sheet figures (memory, dense bf16 and fp32 FLOP/s, HBM bandwidth) plus stated
  assumptions (MFU, link efficiencies), and the host's ``ray.put``/``get`` rates measured here
  (conservative: a GPU node's host is faster than this box). The influence forward+backward is priced as
  the code runs it: float32 (``InfluenceConfig.dtype``) without TF32 (torch's default; d3ray does not
  enable it), so on the fp32 peak, not the bf16 tensor-core one. The O(N) work is priced by its bytes
  (``capacity_model``) at ``HBM_EFFICIENCY`` of the HBM bandwidth.
- ``measured_gpu``: the same measurement run on a GPU (``bench/gpu_check.sh`` writes it to
  ``gpu_constants.json``); the interconnect stays projected (one GPU has no NVLink or InfiniBand peer).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from d3ray.lab.bench.capacity_arch import Architecture, architecture_of, train_flops_per_token
from d3ray.lab.bench.capacity_measure import MeasuredConstants, ModelTiming
from d3ray.lab.bench.capacity_model import DeviceConstants

__all__ = [
    "GPU_SPECS",
    "GpuSpec",
    "cpu_constants",
    "load_device",
    "measured_gpu",
    "projected_gpu",
    "timing_architecture",
    "write_device",
]

#: Projection assumptions (not measured anywhere yet).
MFU_TRAIN = 0.40  # dense bf16 LLM training on H100-class GPUs typically reaches 35-45%
MFU_IN_TRAINER = 0.25  # in-trainer scoring on the engine's bf16 module: n/W sequences a rank, smaller matmuls
FP32_EFFICIENCY = 0.6  # the fp32 (non-tensor-core) influence forward+backward: share of the fp32 peak
HBM_EFFICIENCY = 0.5  # the O(N) influence work (casts, dots, scatter-adds) at half of the HBM bandwidth
PCIE_BYTES_PER_SEC = 25e9  # PCIe Gen5 x16 device↔host copies from pageable memory
OBJECT_BYTES_PER_SEC = 6e9  # Ray object transfer between nodes over a 100 Gb/s front-end NIC (~50%)
LINK_EFFICIENCY = 0.8  # NCCL bus bandwidth / link rate
COLLECTIVE_LATENCY_SEC = 20e-6


@dataclass(frozen=True, kw_only=True)
class GpuSpec:
    """Spec-sheet figures of one GPU model and the links of a typical 8-GPU node."""

    name: str
    memory_bytes: float
    """Total memory as nvidia-smi reports it (MiB × 2^20)."""
    peak_flops: float
    """Dense bf16 tensor-core FLOP/s."""
    fp32_flops: float
    """Dense fp32 FLOP/s without TF32 (what a float32 torch matmul gets by default)."""
    hbm_bytes_per_sec: float
    nvlink_bytes_per_sec: float
    """Per direction per GPU."""
    network_bytes_per_sec: float
    """InfiniBand per GPU (one NIC per GPU)."""
    source: str


GPU_SPECS: dict[str, GpuSpec] = {
    "h100": GpuSpec(name="H100 SXM 80GB", memory_bytes=81559 * 2**20, peak_flops=989.4e12, fp32_flops=66.9e12, hbm_bytes_per_sec=3.35e12,
                    nvlink_bytes_per_sec=450e9, network_bytes_per_sec=50e9,
                    source="NVIDIA H100 datasheet; NVLink 4 900 GB/s bidirectional; NDR 400 Gb/s per GPU"),
    "h200": GpuSpec(name="H200 SXM 141GB", memory_bytes=143771 * 2**20, peak_flops=989.4e12, fp32_flops=66.9e12, hbm_bytes_per_sec=4.8e12,
                    nvlink_bytes_per_sec=450e9, network_bytes_per_sec=50e9,
                    source="NVIDIA H200 datasheet; NVLink 4 900 GB/s bidirectional; NDR 400 Gb/s per GPU"),
    "a100": GpuSpec(name="A100 SXM 80GB", memory_bytes=81920 * 2**20, peak_flops=312e12, fp32_flops=19.5e12, hbm_bytes_per_sec=2.04e12,
                    nvlink_bytes_per_sec=300e9, network_bytes_per_sec=25e9,
                    source="NVIDIA A100 datasheet; NVLink 3 600 GB/s bidirectional; HDR 200 Gb/s per GPU"),
}


def timing_architecture(t: ModelTiming) -> Architecture:
    """The Architecture of a measured model at its measured batch (B = batch_size, one micro-batch)."""
    return architecture_of(t.config, name=t.preset, batch_sequences=t.batch_size, micro_batch=t.batch_size,
                           seq_len=t.seq_len)


def _achieved(t: ModelTiming) -> tuple[float, float]:
    """(training FLOP/s, influence forward+backward FLOP/s) of a measured model."""
    f = train_flops_per_token(timing_architecture(t)) * t.seq_len
    return f * t.batch_size / t.step_sec, f * t.scored_sequences / t.stats_sec_per_batch


def cpu_constants(measured: MeasuredConstants, timing: ModelTiming) -> DeviceConstants:
    """This machine, all measured; peak = the training FLOP/s of ``timing``'s model (so mfu_train = 1)."""
    train, influence = _achieved(timing)
    ar = measured.allreduce
    tag = f"measured: {measured.device}, {measured.threads} thread(s) per process"
    bus = ar.bytes_per_sec if ar else math.inf
    latency = ar.latency_sec / 2 if ar else 0.0  # 2 ranks: 2·⌈log2 2⌉ = 2 latency steps
    return DeviceConstants(
        name=f"{measured.device} ({timing.preset})", memory_bytes=measured.memory_bytes, peak_flops=train,
        mfu_train=1.0, mfu_influence=influence / train, memory_bytes_per_sec=measured.copy_bytes_per_sec,
        put_bytes_per_sec=measured.snapshot.put_bytes_per_sec, get_bytes_per_sec=measured.snapshot.get_bytes_per_sec,
        host_device_bytes_per_sec=math.inf, object_bytes_per_sec=math.inf, intra_node_bytes_per_sec=bus,
        inter_node_bytes_per_sec=bus, devices_per_node=os.cpu_count() or 1, collective_latency_sec=latency,
        provenance={
            "peak_flops": f"{tag} (training step of {timing.preset})", "mfu_influence": tag,
            "memory_bytes_per_sec": f"{tag} (tensor copy, read + write)",
            "put_bytes_per_sec": tag, "get_bytes_per_sec": tag,
            "intra_node_bytes_per_sec": f"{tag} (gloo)" if ar else "none: all-reduce not measured",
            "collective_latency_sec": f"{tag} (gloo)" if ar else "none: all-reduce not measured",
            "host_device_bytes_per_sec": "none: the CPU is the host", "object_bytes_per_sec": "none: one host",
        },
    )


def projected_gpu(kind: str, measured: MeasuredConstants, influence_mfu: float | None = None) -> DeviceConstants:
    """A GPU of ``GPU_SPECS`` with the module's assumptions; every derived number is tagged a projection.

    Args:
        kind: a key of ``GPU_SPECS``.
        measured: this machine's constants (the host's Ray rates).
        influence_mfu: the influence forward+backward's share of the bf16 peak instead of the fp32 worker's
            (a what-if, e.g. 0.25 for a bf16 influence model).
    """
    spec = GPU_SPECS[kind]
    fp32 = FP32_EFFICIENCY * spec.fp32_flops / spec.peak_flops
    host = f"measured: ray.put / ray.get + widening on {measured.device} (a GPU node's host is faster: conservative)"
    mfu_note = (f"projection: the float32 worker without TF32 at {FP32_EFFICIENCY:.0%} of the "
                f"{spec.fp32_flops / 1e12:.1f} TFLOP/s fp32 peak = {fp32:.1%} of the bf16 peak"
                if influence_mfu is None else f"projection: given ({influence_mfu:.0%}, what-if)")
    return DeviceConstants(
        name=spec.name, memory_bytes=spec.memory_bytes, peak_flops=spec.peak_flops, mfu_train=MFU_TRAIN,
        mfu_influence=fp32 if influence_mfu is None else influence_mfu, mfu_in_trainer=MFU_IN_TRAINER,
        memory_bytes_per_sec=spec.hbm_bytes_per_sec * HBM_EFFICIENCY,
        put_bytes_per_sec=measured.snapshot.put_bytes_per_sec, get_bytes_per_sec=measured.snapshot.get_bytes_per_sec,
        host_device_bytes_per_sec=PCIE_BYTES_PER_SEC, object_bytes_per_sec=OBJECT_BYTES_PER_SEC,
        intra_node_bytes_per_sec=LINK_EFFICIENCY * spec.nvlink_bytes_per_sec,
        inter_node_bytes_per_sec=LINK_EFFICIENCY * spec.network_bytes_per_sec, devices_per_node=8,
        collective_latency_sec=COLLECTIVE_LATENCY_SEC,
        provenance={
            "memory_bytes": f"spec: {spec.source}", "peak_flops": f"spec: {spec.source}",
            "mfu_train": f"projection: assumed {MFU_TRAIN:.0%}",
            "mfu_influence": mfu_note,
            "mfu_in_trainer": f"projection: assumed {MFU_IN_TRAINER:.0%} (the trainers' bf16 ZeRO-3 module)",
            "memory_bytes_per_sec": (f"projection: {HBM_EFFICIENCY:.0%} of {spec.hbm_bytes_per_sec / 1e12:.2f} TB/s HBM "
                                     "for the O(N) work's bytes (counted from the code)"),
            "put_bytes_per_sec": host, "get_bytes_per_sec": host,
            "host_device_bytes_per_sec": "projection: PCIe Gen5 x16, pageable",
            "object_bytes_per_sec": "projection: Ray object transfer, 100 Gb/s front-end NIC at ~50%",
            "intra_node_bytes_per_sec": f"projection: {LINK_EFFICIENCY:.0%} of NVLink per direction",
            "inter_node_bytes_per_sec": f"projection: {LINK_EFFICIENCY:.0%} of InfiniBand per GPU",
            "collective_latency_sec": "projection: NCCL small-message step",
        },
    )


def measured_gpu(kind: str, measured: MeasuredConstants) -> DeviceConstants:
    """``projected_gpu`` with what one GPU measures replacing the projections: memory, MFU of a training step
    and of the influence forward+backward (largest measured model), copy bandwidth, and this host's Ray rates."""
    base = projected_gpu(kind, measured)
    timing = max(measured.models, key=lambda t: t.params)
    train, influence = _achieved(timing)
    tag = f"measured: {measured.device} ({timing.preset}, B={timing.batch_size}, T={timing.seq_len})"
    values = asdict(base)
    values.update(
        name=f"{base.name} (measured)", memory_bytes=measured.memory_bytes, mfu_train=train / base.peak_flops,
        mfu_influence=influence / base.peak_flops, memory_bytes_per_sec=measured.copy_bytes_per_sec,
        provenance={**base.provenance, "memory_bytes": tag, "mfu_train": tag, "mfu_influence": tag,
                    "memory_bytes_per_sec": tag, "put_bytes_per_sec": tag, "get_bytes_per_sec": tag},
    )
    return DeviceConstants(**values)


def write_device(dev: DeviceConstants, path: Path) -> None:
    """JSON of every field (infinite rates as the string ``"inf"``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(jsonable(asdict(dev)), indent=1))


def load_device(path: Path) -> DeviceConstants:
    """A ``write_device`` file (``bench/gpu_check.sh`` writes ``gpu_constants.json``)."""
    raw = json.loads(path.read_text())
    return DeviceConstants(**{k: (math.inf if v == "inf" else v) for k, v in raw.items()})


def jsonable(value: Any) -> Any:
    """Nested dicts/lists with non-finite floats as strings (JSON has no inf)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value
