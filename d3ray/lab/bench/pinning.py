"""``d3ray bench pipeline --own-cores``: trainers on cores of their own, everything else on the rest.

Issue 50 asks for the default D3's cost where the trainers have their own devices (a GPU each, in
production) as well as on a laptop, where influence, the coordinator and Ray's daemons share the trainers'
cores. Without a GPU the stand-in is CPU affinity: trainer i runs on core i alone, and every other process
of the run (the driver, the coordinator, influence and tokenizer actors, Ray's daemons) on the cores after
the trainers'. Both runs of a pair are pinned the same way, so random order's trainers own their cores too.

:class:`CorePinner` re-reads ``/proc`` every ``interval_s`` while a run trains and sets the affinity of any
process of the run (every thread of it) whose affinity is not its plan's (:func:`core_plan`): a Ray worker that turns into a
trainer between two runs is moved with its new title. The run's processes are this driver and its
descendants (the local Ray instance the bench starts: its daemons and workers); anything else on the box,
another Ray instance included, is left alone. Linux only (``/proc``, ``sched_setaffinity``).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping

from d3ray.lab.bench.cpu_share import PROC, _cmdline, role_of

logger = logging.getLogger(__name__)

TRAINER_ROLE = "RayTrainWorker"


def core_plan(roles: Mapping[int, str], cpus: int, trainers: int) -> dict[int, set[int]]:
    """pid → the cores it may run on: the i-th trainer by pid core i; every other process of the run
    (role other than ``other``) the cores after ``trainers``.

    Raises:
        ValueError: no core is left for the rest (``trainers >= cpus``), or more trainer processes than
            ``trainers`` are running.
    """
    if not 0 < trainers < cpus:
        raise ValueError(f"--own-cores needs fewer trainers than cores: {trainers} trainers on {cpus} cores "
                         "leave none for the coordinator and the actors")
    pinned = sorted(pid for pid, role in roles.items() if role == TRAINER_ROLE)
    if len(pinned) > trainers:
        raise ValueError(f"{len(pinned)} {TRAINER_ROLE} processes for {trainers} trainers")
    rest = set(range(trainers, cpus))
    plan = {pid: {i} for i, pid in enumerate(pinned)}
    plan.update({pid: rest for pid, role in roles.items() if role not in (TRAINER_ROLE, "other")})
    return plan


def _parent(pid: str) -> int | None:
    try:
        return int((PROC / pid / "stat").read_text().rsplit(")", 1)[1].split()[1])  # field 4: ppid
    except (OSError, IndexError, ValueError):
        return None


def _threads(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(PROC / str(pid) / "task")]
    except OSError:
        return []


def descendants(root: int) -> set[int]:
    """``root`` and every process below it (one pass over ``/proc``)."""
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit() and (parent := _parent(entry.name)) is not None:
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


class CorePinner:
    """Keeps the run's processes on their :func:`core_plan` cores while a block runs::

        with CorePinner(trainers=1):
            run_pretrain(cfg)
    """

    def __init__(self, trainers: int, interval_s: float = 0.5) -> None:
        self.trainers, self.interval_s = trainers, interval_s
        self.cpus = len(os.sched_getaffinity(0))
        core_plan({}, self.cpus, trainers)  # refuse a plan with no core left before the run starts
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._me = os.getpid()
        self._original = os.sched_getaffinity(0)
        self.moves = 0
        self.trainers_seen: set[int] = set()

    def _roles(self) -> dict[int, str]:
        """The role of this driver and of each of its descendants."""
        return {pid: "driver" if pid == self._me else role_of(_cmdline(str(pid))) for pid in descendants(self._me)}

    def pin_once(self) -> None:
        """Move every process of the run that is off its plan's cores (one pass over ``/proc``)."""
        roles = self._roles()
        self.trainers_seen |= {pid for pid, role in roles.items() if role == TRAINER_ROLE}
        try:
            plan = core_plan(roles, self.cpus, self.trainers)
        except ValueError as err:  # e.g. the last run's trainer still exiting: this pass moves nothing, the next retries
            logger.warning("--own-cores: %s; pinning again in %.1f s", err, self.interval_s)
            return
        for pid, cores in plan.items():
            for tid in _threads(pid):  # affinity is per thread: a process started on the rest's cores keeps
                try:               # the threads it made there (Ray's, gloo's) unless each is moved
                    if os.sched_getaffinity(tid) != cores:
                        os.sched_setaffinity(tid, cores)
                        self.moves += 1
                except (ProcessLookupError, PermissionError, OSError):
                    continue  # ended since the scan, or not ours to move

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.pin_once()

    def __enter__(self) -> CorePinner:
        self.pin_once()
        self._thread = threading.Thread(target=self._loop, name="core-pinner", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        for tid in _threads(self._me):  # this driver gets its cores back; the run's workers keep theirs
            try:
                os.sched_setaffinity(tid, self._original)
            except OSError:
                continue
        if not self.trainers_seen:
            logger.warning("--own-cores: no %s among this driver's processes (a Ray cluster this bench did not "
                           "start?): the trainers were not pinned", TRAINER_ROLE)
