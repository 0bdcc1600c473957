"""The pipeline benchmark's CPU accounting (d3ray/lab/bench/cpu_share.py): roles from Ray's process
titles, a child's CPU time attributed to it, runs pooled by wall time."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from d3ray.lab.bench.cpu_share import PROC, CpuShare, pool_cpu_shares, role_of


@pytest.mark.parametrize(("cmdline", "role"), [
    ("ray::ChunkInfluenceWorker.sketch_chunk()", "ChunkInfluenceWorker"),
    ("ray::RayTrainWorker._RayTrainWorker__execute.get_next", "RayTrainWorker"),
    ("ray::d3ray:run:influence:0:ChunkInfluenceWorker.sketch_chunk", "ChunkInfluenceWorker"),
    ("ray::d3ray:tiny.v2:influence:0:ChunkInfluenceWorker.order_chunk", "ChunkInfluenceWorker"),  # a dot in the run name
    ("ray::IDLE", "ray-idle"),
    ("ray::", "ray-idle"),
    ("/usr/lib/python3/site-packages/ray/core/src/ray/raylet/raylet --node_id=1", "ray-system"),
    ("python -m pytest", "other"),
])
def test_role_of_a_process_title(cmdline, role):
    assert role_of(cmdline) == role


@pytest.mark.skipif(not PROC.joinpath("self", "stat").is_file(), reason="needs Linux /proc")
def test_cpu_time_of_a_child_is_counted_under_its_role():
    # after its 1 s of CPU the child idles for three sampling intervals: the sampler reads a process's time at
    # each interval, so a child that exited at once would lose up to the last one (CpuShare's docstring)
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.0: pass\ntime.sleep(0.6)"
    with CpuShare(interval_s=0.2) as share:
        # the child titled as a Ray actor of a class nothing else on the box runs: its role is its own, whatever
        # else the box is doing (the rest of the box's processes count as "other")
        subprocess.run(["ray::CpuShareProbe", "-c", burn], executable=sys.executable, check=True)
        busy_until = time.process_time() + 0.3
        while time.process_time() < busy_until:
            pass
    summary = share.summary()
    seconds = {role: v * summary["wall_sec"] * summary["cpus"] for role, v in summary["by_role"].items()}
    assert 0.9 <= seconds["CpuShareProbe"] <= 1.6, seconds  # the child: 1 s of CPU (+ interpreter start)
    assert 0.25 <= seconds["driver"], seconds  # this process's own 0.3 s loop
    assert summary["busy"] == pytest.approx(sum(summary["by_role"].values()))


def test_pooled_shares_weigh_runs_by_wall_time():
    pooled = pool_cpu_shares([
        {"wall_sec": 10.0, "cpus": 2, "by_role": {"RayTrainWorker": 0.8}, "busy": 0.8},
        {"wall_sec": 30.0, "cpus": 2, "by_role": {"RayTrainWorker": 0.4, "ChunkInfluenceWorker": 0.2}, "busy": 0.6},
        {},  # a run without /proc
    ])
    assert pooled["wall_sec"] == 40.0
    assert pooled["by_role"] == pytest.approx({"RayTrainWorker": 0.5, "ChunkInfluenceWorker": 0.15})
    assert list(pooled["by_role"]) == ["RayTrainWorker", "ChunkInfluenceWorker"]
    assert pool_cpu_shares([{}]) == {}
