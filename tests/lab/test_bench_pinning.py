"""``d3ray bench pipeline --own-cores``: the plan that gives each trainer a core of its own and the rest of the
run the other cores, and the pinner applying it to real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from d3ray.lab.bench.pinning import CorePinner, core_plan, descendants


def test_core_plan_gives_each_trainer_its_own_core_and_the_run_the_rest():
    roles = {40: "RayTrainWorker", 12: "RayTrainWorker", 7: "driver", 99: "ScheduleCoordinator", 5: "ray-system",
             3: "other", 8: "ray-idle"}
    plan = core_plan(roles, cpus=4, trainers=2)
    assert plan[12] == {0} and plan[40] == {1}  # by pid
    assert plan[7] == plan[99] == plan[5] == plan[8] == {2, 3}
    assert 3 not in plan  # not the run's: left alone


@pytest.mark.parametrize(("cpus", "trainers", "match"), [(2, 2, "leave none"), (2, 0, "fewer trainers"), (1, 1, "leave none")])
def test_core_plan_refuses_a_plan_without_a_core_for_the_rest(cpus, trainers, match):
    with pytest.raises(ValueError, match=match):
        core_plan({}, cpus=cpus, trainers=trainers)


def test_core_plan_refuses_more_trainer_processes_than_trainers():
    with pytest.raises(ValueError, match="3 RayTrainWorker processes for 2 trainers"):
        core_plan({1: "RayTrainWorker", 2: "RayTrainWorker", 3: "RayTrainWorker"}, cpus=4, trainers=2)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux affinity and at least 2 cores")
def test_pinner_moves_a_trainer_titled_process_to_core_0_and_gives_the_driver_its_cores_back():
    # a process whose command line reads like a Ray Train worker's title
    title = ["ray::RayTrainWorker.__init__", "-c",
             "import threading, time; threading.Thread(target=time.sleep, args=(30,)).start(); time.sleep(30)"]
    child = subprocess.Popen(title, executable=sys.executable)
    # the same title outside the driver's tree (its parent exits at once): another run's, left alone
    orphan = int(subprocess.run([sys.executable, "-c", "import subprocess, sys; print(subprocess.Popen("
                                 f"{title!r}, executable=sys.executable, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)"],
                                capture_output=True, text=True, check=True).stdout)
    before = os.sched_getaffinity(0)
    deadline = time.monotonic() + 10
    while len(os.listdir(f"/proc/{child.pid}/task")) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)  # the child's second thread started
    try:
        assert child.pid in descendants(os.getpid()) and orphan not in descendants(os.getpid())
        with CorePinner(trainers=1, interval_s=0.05) as pinner:
            threads = [int(t) for t in os.listdir(f"/proc/{child.pid}/task")]
            assert len(threads) == 2 and all(os.sched_getaffinity(t) == {0} for t in threads)  # every thread
            assert os.sched_getaffinity(0) == set(range(1, len(before)))  # the driver runs with the rest
            assert os.sched_getaffinity(orphan) == before
        assert pinner.moves >= 2 and pinner.trainers_seen == {child.pid}
        assert os.sched_getaffinity(0) == before
    finally:
        child.kill()
        child.wait()
        os.kill(orphan, signal.SIGKILL)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux affinity and at least 2 cores")
def test_pinner_pass_with_more_trainer_processes_than_trainers_moves_nothing_and_keeps_running(caplog):
    title = ["ray::RayTrainWorker.__init__", "-c", "import time; time.sleep(30)"]
    children = [subprocess.Popen(title, executable=sys.executable) for _ in range(2)]
    try:
        pinner = CorePinner(trainers=1)
        pinner.pin_once()  # in the background thread a raise would end the pinning for the rest of the run
        assert pinner.moves == 0 and "2 RayTrainWorker processes for 1 trainers" in caplog.text
    finally:
        for child in children:
            child.kill()
            child.wait()
