"""What an actor may use: its device and its CPU threads, from the Ray resources it reserved.

Ray schedules GPUs and CPUs as resources; a process can still see more than it reserved. An actor
created with ``num_gpus=0`` on a GPU node sees ``cuda:0`` (``torch.cuda.is_available()`` is True), and
putting its model there takes memory and time from the trainer that did reserve it; an actor that
reserved 8 CPUs but calls ``torch.set_num_threads(1)`` leaves 7 idle. So the influence and scoring
actors ask here instead of probing:

- :func:`actor_device`: ``auto`` is ``cuda`` when this Ray actor holds a GPU share (Ray then makes
  exactly its GPUs visible, so ``cuda:0`` is its own) and ``cpu`` when it holds none; outside a Ray
  actor (tests, benchmarks) ``cuda`` when one is available. An explicit device is taken as given.
- :func:`actor_threads`: the CPUs this Ray actor reserved (at least 1); outside an actor, torch's own count.
- :func:`lower_priority` / :func:`cpu_priority`: how a background actor yields the cores it shares with
  the trainers (OS niceness, or Linux's ``SCHED_IDLE`` policy), and how to read it back.

Nothing here imports Ray: a process that has not imported it is not a Ray actor.
"""

from __future__ import annotations

import logging
import math
import os
import sys

import torch

__all__ = ["actor_device", "actor_resources", "actor_threads", "cpu_priority", "device_for_resources",
           "lower_priority"]

logger = logging.getLogger(__name__)


def actor_resources() -> dict[str, float] | None:
    """The resources this Ray actor reserved (``{"CPU": 1.0, "GPU": 0.5}``), or None outside an actor."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    context = ray.get_runtime_context()
    if context.get_actor_id() is None:  # the driver or a task: nothing reserved for an actor
        return None
    return dict(context.get_assigned_resources())


def device_for_resources(setting: str, resources: dict[str, float] | None, cuda_available: bool) -> torch.device:
    """The device for a device ``setting`` (``auto``, ``cpu``, ``cuda``, ``cuda:N``) given an actor's
    reserved ``resources`` (None: not an actor) and whether CUDA is available (see the module docstring)."""
    if setting != "auto":
        return torch.device(setting)
    if resources is None:
        return torch.device("cuda" if cuda_available else "cpu")
    return torch.device("cuda", 0) if cuda_available and resources.get("GPU", 0.0) > 0 else torch.device("cpu")


def actor_device(setting: str = "auto") -> torch.device:
    """This process's device for ``setting``: see :func:`device_for_resources`."""
    return device_for_resources(setting, actor_resources(), torch.cuda.is_available())


def actor_threads() -> int:
    """Intra-op threads for this process: the CPUs its Ray actor reserved (rounded down, at least 1), or
    ``torch.get_num_threads()`` outside an actor."""
    resources = actor_resources()
    if resources is None:
        return torch.get_num_threads()
    return max(1, math.floor(resources.get("CPU", 1.0)))


def lower_priority(nice: int = 0, idle: bool = False) -> None:
    """Run the calling thread at OS niceness ``nice`` at least (raised to it, never lowered) and, with
    ``idle``, under Linux's ``SCHED_IDLE`` policy: it then runs only on a core no other thread wants
    (CFS weight 3 against 36 for a Ray worker at niceness 15, 15 at niceness 19).

    Linux keeps both per thread, and threads created later inherit them from their creator (torch's
    intra-op pool, created at the first parallel op). The calling thread only, on purpose: a Ray
    actor runs its tasks on its main thread, and its other threads are Ray's own (gRPC, the object
    store's transfers), which the coordinator and the trainers wait on; starving those slowed the
    trainers by half in ``d3ray bench pipeline`` (2026-12-03). Where ``SCHED_IDLE`` does not exist
    (not Linux) a warning says so and the niceness alone applies.
    """
    current = os.nice(0)
    if nice > current:
        os.nice(nice - current)
    if not idle:
        return
    if not hasattr(os, "SCHED_IDLE"):
        logger.warning("SCHED_IDLE is Linux-only: this actor runs at niceness %d instead", max(nice, current))
        return
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


def cpu_priority() -> str:
    """This process's CPU priority as :func:`lower_priority` sets it: ``"idle"`` or ``"nice N"``."""
    if hasattr(os, "SCHED_IDLE") and os.sched_getscheduler(0) == os.SCHED_IDLE:
        return "idle"
    return f"nice {os.nice(0)}"
