"""Device constants of the capacity model: the GPU projection from CPU measurements, measured GPU
constants replacing projections, and the ``gpu_constants.json`` round trip."""

from __future__ import annotations

import math

import pytest

from d3ray.lab.bench.capacity_devices import (
    FP32_EFFICIENCY,
    GPU_SPECS,
    HBM_EFFICIENCY,
    MFU_IN_TRAINER,
    cpu_constants,
    load_device,
    measured_gpu,
    projected_gpu,
    write_device,
)
from tests.lab.capacity_cases import hand_measured as _measured


def test_capacity_cpu_constants_come_from_the_measured_step_and_batch():
    dev = cpu_constants(_measured(), _measured().models[0])
    assert dev.peak_flops == pytest.approx(1896 * 3 * 8 / 2.0) and dev.mfu_train == 1.0
    assert dev.mfu_influence == pytest.approx((1896 * 3 * 1 / 0.2) / (1896 * 3 * 8 / 2.0))  # = 2.5
    assert dev.mfu_in_trainer is None  # the CPU runs both in float32
    assert dev.memory_bytes_per_sec == 1e9  # the measured copy bandwidth
    assert (dev.put_bytes_per_sec, dev.get_bytes_per_sec) == (1000.0, 2000.0)
    assert dev.intra_node_bytes_per_sec == pytest.approx(2 * 0.5 * 4000 / 0.01)  # ring bus bandwidth
    assert dev.collective_latency_sec == pytest.approx(0.002)
    assert dev.projected_fields == []


def test_capacity_projected_gpu_prices_the_float32_worker_and_the_bytes_at_hbm():
    dev = projected_gpu("h100", _measured())
    # the influence worker computes in float32 without TF32: 60% of 66.9 TFLOP/s = 4.06% of the bf16 peak
    assert dev.mfu_influence == pytest.approx(FP32_EFFICIENCY * 66.9e12 / 989.4e12)
    assert dev.mfu_influence == pytest.approx(0.04057, rel=1e-3)
    assert dev.mfu_in_trainer == MFU_IN_TRAINER  # in-trainer: the engine's bf16 module
    assert dev.memory_bytes_per_sec == pytest.approx(3.35e12 * HBM_EFFICIENCY)
    assert {"mfu_train", "mfu_influence", "mfu_in_trainer", "memory_bytes_per_sec",
            "inter_node_bytes_per_sec"} <= set(dev.projected_fields)
    assert dev.provenance["peak_flops"].startswith("spec")
    bf16 = projected_gpu("h200", _measured(), influence_mfu=0.25)  # the what-if of --influence-mfu
    assert bf16.mfu_influence == 0.25 and "what-if" in bf16.provenance["mfu_influence"]
    assert GPU_SPECS["a100"].fp32_flops == 19.5e12


def test_capacity_measured_gpu_replaces_compute_projections_and_keeps_links_projected():
    dev = measured_gpu("h200", _measured("NVIDIA H200"))
    assert dev.mfu_train == pytest.approx(1896 * 3 * 8 / 2.0 / GPU_SPECS["h200"].peak_flops)
    assert dev.mfu_influence == pytest.approx(1896 * 3 * 1 / 0.2 / GPU_SPECS["h200"].peak_flops)
    assert dev.memory_bytes_per_sec == 1e9 and dev.memory_bytes == 1e9
    assert dev.projected_fields == ["collective_latency_sec", "host_device_bytes_per_sec", "inter_node_bytes_per_sec",
                                    "intra_node_bytes_per_sec", "mfu_in_trainer", "object_bytes_per_sec"]


def test_capacity_device_json_round_trip_keeps_infinite_rates(tmp_path):
    dev = cpu_constants(_measured(), _measured().models[0])
    assert math.isinf(dev.host_device_bytes_per_sec)
    write_device(dev, tmp_path / "gpu_constants.json")
    assert load_device(tmp_path / "gpu_constants.json") == dev
