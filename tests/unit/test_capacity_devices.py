"""Device constants of the capacity model: the GPU projection from CPU measurements, measured GPU
constants replacing projections, and the ``gpu_constants.json`` round trip."""

from __future__ import annotations

import math

import pytest

from d3ray.bench.capacity_devices import (
    GPU_SPECS,
    HBM_EFFICIENCY,
    cpu_constants,
    load_device,
    measured_gpu,
    projected_gpu,
    write_device,
)
from tests.capacity_cases import hand_measured as _measured


def test_capacity_cpu_constants_come_from_the_measured_step_and_batch():
    dev = cpu_constants(_measured(), _measured().models[0])
    assert dev.peak_flops == pytest.approx(1896 * 3 * 8 / 2.0) and dev.mfu_train == 1.0
    assert dev.mfu_influence == pytest.approx((1896 * 3 * 1 / 0.2) / (1896 * 3 * 8 / 2.0))  # = 2.5
    assert dev.coordinate_sec == pytest.approx(0.3 / 304)
    assert (dev.put_bytes_per_sec, dev.get_bytes_per_sec) == (1000.0, 2000.0)
    assert dev.intra_node_bytes_per_sec == pytest.approx(2 * 0.5 * 4000 / 0.01)  # ring bus bandwidth
    assert dev.collective_latency_sec == pytest.approx(0.002)
    assert dev.projected_fields == []


def test_capacity_projected_gpu_carries_the_copy_equivalent_bytes_to_hbm():
    dev = projected_gpu("h100", _measured())
    coord_bytes = 0.3 / 304 * 1e9  # c_coord × measured copy bandwidth
    assert dev.coordinate_sec == pytest.approx(coord_bytes / (GPU_SPECS["h100"].hbm_bytes_per_sec * HBM_EFFICIENCY))
    assert {"mfu_train", "mfu_influence", "coordinate_sec", "inter_node_bytes_per_sec"} <= set(dev.projected_fields)
    assert dev.provenance["peak_flops"].startswith("spec")
    fused = projected_gpu("h100", _measured(), coordinate_bytes=64)  # the what-if of --coordinate-bytes
    assert fused.coordinate_sec == pytest.approx(64 / (3.35e12 * HBM_EFFICIENCY))


def test_capacity_measured_gpu_replaces_compute_projections_and_keeps_links_projected():
    dev = measured_gpu("h200", _measured("NVIDIA H200"))
    assert dev.mfu_train == pytest.approx(1896 * 3 * 8 / 2.0 / GPU_SPECS["h200"].peak_flops)
    assert dev.coordinate_sec == pytest.approx(0.3 / 304) and dev.memory_bytes == 1e9
    assert dev.projected_fields == ["collective_latency_sec", "host_device_bytes_per_sec", "inter_node_bytes_per_sec",
                                    "intra_node_bytes_per_sec", "object_bytes_per_sec"]


def test_capacity_device_json_round_trip_keeps_infinite_rates(tmp_path):
    dev = cpu_constants(_measured(), _measured().models[0])
    assert math.isinf(dev.host_device_bytes_per_sec)
    write_device(dev, tmp_path / "gpu_constants.json")
    assert load_device(tmp_path / "gpu_constants.json") == dev
