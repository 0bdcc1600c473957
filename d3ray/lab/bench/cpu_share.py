"""Where a run's CPU time goes, by process role: the accounting behind ``d3ray bench pipeline``'s
``cpu_share`` figures.

On a box where the influence actor shares the trainers' cores, a throughput ratio mixes two things:
the CPU the actor takes, and what that costs the trainers beyond it (lock-step data parallelism: a
trainer slowed on its core makes the other wait at the all-reduce). Reading the kernel's own
accounting separates them. :class:`CpuShare` samples ``utime + stime`` of every process under
``/proc`` about once a second while a run trains and adds each process's time since its previous
sample to its role (a process that ends between samples loses at most that second), the role named by Ray's process title (``ray::RayTrainWorker...``,
``ray::ChunkInfluenceWorker...``; this process is ``driver``, Ray's daemons ``ray-system``, the
rest ``other``). The share of a role is its
CPU seconds ÷ (wall seconds × CPUs of the box): 1.0 is every core busy with that role.

Linux only (``/proc``); elsewhere :meth:`CpuShare.summary` is empty and the benchmark says so.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

PROC = Path("/proc")
TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def role_of(cmdline: str) -> str:
    """The role of a process from its command line: the actor class of a Ray worker's title
    (``ray::ChunkInfluenceWorker.sketch_chunk`` -> ``ChunkInfluenceWorker``, also when the actor is
    named: ``ray::d3ray:run:influence:0:ChunkInfluenceWorker``), ``ray-idle`` for an
    idle pooled worker, ``ray-system`` for Ray's own daemons, else ``other``."""
    if cmdline.startswith("ray::"):
        words = cmdline[len("ray::"):].split()
        name = words[0].rsplit(":", 1)[-1].split(".")[0] if words else ""  # a named actor: <name>:<Class>
        return "ray-idle" if name in ("IDLE", "") else name
    if any(d in cmdline for d in ("raylet", "gcs_server", "dashboard", "log_monitor", "monitor.py",
                                  "runtime_env/agent", "ray/_private")):
        return "ray-system"
    return "other"


def _cpu_seconds(pid: str) -> float | None:
    try:
        fields = (PROC / pid / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime (fields 14 and 15 of stat)


def _cmdline(pid: str) -> str:
    try:
        return (PROC / pid / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


class CpuShare:
    """A background sampler of per-process CPU time while a block runs::

        with CpuShare() as share:
            run_pretrain(cfg)
        share.summary()  # {"wall_sec": ..., "cpus": 2, "by_role": {"RayTrainWorker": 0.81, ...}, ...}
    """

    def __init__(self, interval_s: float = 1.0) -> None:
        self.interval_s = interval_s
        self.available = PROC.joinpath("self", "stat").is_file()
        self._seconds: dict[str, float] = {}  # pid -> CPU seconds at its last sample
        self._by_role: dict[str, float] = {}  # role -> CPU seconds used in the window
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._wall = (0.0, 0.0)

    def _sample(self, first: bool = False) -> None:
        """Add each process's CPU time since its last sample to its role now (a pooled Ray worker
        that changes title between samples has the interval counted under the new title)."""
        me = str(os.getpid())
        for pid in (p.name for p in PROC.iterdir() if p.name.isdigit()):
            seconds = _cpu_seconds(pid)
            if seconds is None:
                continue
            previous = self._seconds.get(pid, seconds if first else 0.0)  # a new process: all of its time
            self._seconds[pid] = seconds
            if seconds > previous:
                role = "driver" if pid == me else role_of(_cmdline(pid))
                self._by_role[role] = self._by_role.get(role, 0.0) + seconds - previous

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> CpuShare:
        if self.available:
            self._sample(first=True)
            self._thread = threading.Thread(target=self._loop, name="cpu-share", daemon=True)
            self._thread.start()
        self._wall = (time.perf_counter(), 0.0)
        return self

    def __exit__(self, *exc: object) -> None:
        self._wall = (self._wall[0], time.perf_counter())
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._sample()

    def summary(self) -> dict[str, object]:
        """Wall seconds, CPUs, and per role the share of the box's CPU capacity it used (see module)."""
        if not self.available:
            return {}
        wall = self._wall[1] - self._wall[0]
        cpus = os.cpu_count() or 1
        shares = {role: used / (wall * cpus) for role, used in sorted(self._by_role.items(), key=lambda kv: -kv[1])}
        return {"wall_sec": wall, "cpus": cpus, "by_role": shares, "busy": sum(shares.values())}


def pool_cpu_shares(summaries: list[dict[str, object]]) -> dict[str, object]:
    """Several runs' :meth:`CpuShare.summary` pooled by wall time (each share weighted by its run's wall)."""
    summaries = [s for s in summaries if s]
    if not summaries:
        return {}
    wall = sum(float(s["wall_sec"]) for s in summaries)
    roles = sorted({r for s in summaries for r in s["by_role"]})
    shares = {r: sum(float(s["by_role"].get(r, 0.0)) * float(s["wall_sec"]) for s in summaries) / wall for r in roles}
    shares = dict(sorted(shares.items(), key=lambda kv: -kv[1]))
    return {"wall_sec": wall, "cpus": summaries[0]["cpus"], "by_role": shares, "busy": sum(shares.values())}
