"""Where a process group wants its collective tensors, and a sum over ranks that puts them there.

A collective runs on the backend registered for its tensor's device: gloo takes CPU tensors, NCCL takes
CUDA tensors of the rank's own GPU, and a mixed backend (``"cpu:gloo,cuda:nccl"``, what the GPU runs
use, see ``d3ray/run/pretrain.py``) takes either. A CPU tensor handed to an NCCL-only group fails at the first
collective (and a CUDA tensor handed to a gloo group fails just the same), so every tensor the trainers
reduce is created on, or moved to, :func:`collective_device` of its group: the one rule, written once.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["all_reduce_sum", "backend_device", "collective_device"]

#: The device type each single backend reduces on.
_BACKEND_DEVICE_TYPES = {"gloo": "cpu", "mpi": "cpu", "nccl": "cuda", "ucc": "cuda", "xccl": "xpu"}


def backend_device(backend: str, accelerator_available: bool) -> torch.device:
    """The device type collectives of a group with this backend string want.

    Args:
        backend: ``torch.distributed.get_backend(group)``: a single backend (``"gloo"``, ``"nccl"``) or a
            device map (``"cpu:gloo,cuda:nccl"``).
        accelerator_available: whether this process has the accelerator (CUDA) the map offers.

    Returns:
        ``cpu`` or ``cuda`` (no index: :func:`collective_device` adds this rank's). A device map picks
        its accelerator when it is available (the tensors being reduced live there, and NCCL is the
        fast path), else its CPU backend.

    Raises:
        ValueError: the backend string names no device this module knows how to use.
    """
    text = backend.lower()
    if ":" in text:
        types = [part.split(":", 1)[0].strip() for part in text.split(",")]
        accelerators = [t for t in types if t != "cpu"]
        if accelerators and accelerator_available:
            return torch.device(accelerators[0])
        if "cpu" in types:
            return torch.device("cpu")
        raise ValueError(f"process-group backend {backend!r} has no CPU backend and no accelerator is available")
    if text not in _BACKEND_DEVICE_TYPES:
        raise ValueError(f"unknown process-group backend {backend!r}: expected one of {sorted(_BACKEND_DEVICE_TYPES)} "
                         "or a device map like 'cpu:gloo,cuda:nccl'")
    return torch.device(_BACKEND_DEVICE_TYPES[text])


def collective_device(group: Any = None) -> torch.device:
    """The device tensors of collectives on ``group`` (default: the world) must be on, for this rank.

    CUDA means the rank's current device (Ray Train and DeepSpeed set it per worker).
    """
    import torch.distributed as dist

    device = backend_device(str(dist.get_backend(group)), torch.cuda.is_available())
    if device.type == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return device


def all_reduce_sum(tensor: torch.Tensor, group: Any = None) -> torch.Tensor:
    """A new tensor: ``tensor`` summed over the ranks of ``group``, on ``tensor``'s own device.

    Every rank calls it in the same order (a collective). The reduction runs on
    :func:`collective_device`; a tensor already there is only cloned.
    """
    import torch.distributed as dist

    out = tensor.to(collective_device(group), copy=True)
    dist.all_reduce(out, group=group)
    return out.to(tensor.device)
