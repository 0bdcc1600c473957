"""Reading a weights snapshot into a model: the one reader of every actor that loads the trainers' weights.

The trainers publish a snapshot (``d3ray/train/scheduling/snapshot.py``) as a list of parts: state dicts (name → array;
numpy, or torch where numpy has no dtype, as bfloat16; the trainers ship each packed into one buffer,
:class:`PackedState`, a mapping of views) and at most one
:class:`~d3ray.influence.optimizer.AdamWState`. The influence actors
(:class:`~d3ray.influence.worker.InfluenceWorker`) and the scoring actors
(:class:`~d3ray.schedule.scoring.ScoringWorker`) both read it here, strictly:

    parts ─► split_snapshot ─► (weights: name → array, optimizer state or None)
    weights ─► load_snapshot(model, weights)   every model tensor from its name (or a tied name), cast to the
                                               model's dtype and device; an unknown or missing key is a
                                               ValueError that names it, never a tensor silently left as built

A leading ``module.`` on every key (a DeepSpeed engine's state dict) is stripped. A tied weight (GPT-2's
``lm_head.weight`` is ``transformer.wte.weight``) needs one of its names. The attention buffers some
transformers versions keep in GPT-2 state dicts (``attn.bias``, ``attn.masked_bias``) may be carried or
omitted: they are not weights.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from d3ray.influence.optimizer import AdamWState
from d3ray.ray_refs import resolve

__all__ = ["PackedState", "load_snapshot", "split_snapshot"]

#: Buffers some transformers versions keep in GPT-2 state dicts; a snapshot may carry or omit them.
OPTIONAL_KEYS = re.compile(r"(^|\.)attn\.(bias|masked_bias)$")


class PackedState(Mapping):
    """A state dict (name → tensor) in one flat buffer: what the trainers ship (``d3ray/train/scheduling/snapshot.py``).

    Ray pickles a torch tensor through torch's own serializer, one call per tensor each way, and a snapshot
    of weights + m + v holds three tensors per parameter (87 for the no-argument run's GPT-2): ~10 ms per
    chunk for a trainer to ship, ~7 ms for an actor to read. Packed, a part is one buffer: a bfloat16 torch
    tensor, or a float32 numpy array (which Ray ships without a copy); a value is a view into it, in the
    shape of its parameter.

    Example: ``PackedState.empty({"a": (2,), "b": (1, 2)}, "float32")`` filled by ``fill("b", [[1, 2]])``
    reads ``{"a": [0, 0], "b": [[1, 2]]}`` from a flat buffer of 4 floats.
    """

    def __init__(self, flat: torch.Tensor | np.ndarray, index: Mapping[str, tuple[int, tuple[int, ...]]]) -> None:
        self.flat = flat
        self.index = dict(index)  # name → (offset, shape)

    @classmethod
    def empty(cls, shapes: Mapping[str, Sequence[int]], dtype: str) -> PackedState:
        """Zeros for tensors of these shapes (in this order), in ``dtype``: ``float32`` or ``bfloat16``.

        Raises:
            ValueError: another dtype.
        """
        index, offset = {}, 0
        for name, shape in shapes.items():
            index[name] = (offset, tuple(int(d) for d in shape))
            offset += int(np.prod(shape, dtype=np.int64))
        if dtype == "float32":
            return cls(np.zeros(offset, dtype=np.float32), index)
        if dtype == "bfloat16":
            return cls(torch.zeros(offset, dtype=torch.bfloat16), index)
        raise ValueError(f"a packed state is float32 or bfloat16, not {dtype!r}")

    @classmethod
    def pack(cls, state: Mapping[str, Any], dtype: str) -> PackedState:
        """A copy of ``state`` (tensors or arrays by name, any float dtype and device) in ``dtype``."""
        packed = cls.empty({name: tuple(np.shape(value)) for name, value in state.items()}, dtype)
        for name, value in state.items():
            packed.fill(name, value)
        return packed

    def fill(self, name: str, value: Any) -> None:
        """Copy ``value`` (a tensor or array of ``name``'s shape) into ``name``'s place, converting its dtype.

        Raises:
            ValueError: another shape (named).
        """
        offset, shape = self.index[name]
        if tuple(np.shape(value)) != shape:
            raise ValueError(f"packed state {name!r}: shape {tuple(np.shape(value))}, expected {shape}")
        n = int(np.prod(shape, dtype=np.int64))
        source = value.detach() if torch.is_tensor(value) else torch.from_numpy(np.ascontiguousarray(value))
        if isinstance(self.flat, np.ndarray):
            self.flat[offset : offset + n] = source.to(device="cpu", dtype=torch.float32).reshape(-1).numpy()
        else:
            self.flat[offset : offset + n].copy_(source.reshape(-1))

    def __getitem__(self, name: str) -> torch.Tensor | np.ndarray:
        offset, shape = self.index[name]
        return self.flat[offset : offset + int(np.prod(shape, dtype=np.int64))].reshape(shape)

    def __iter__(self):
        return iter(self.index)

    def __len__(self) -> int:
        return len(self.index)


def split_snapshot(parts: Sequence[Any] | Mapping[str, Any]) -> tuple[dict[str, Any], AdamWState | None]:
    """(weights, optimizer state) of a snapshot: a weights dict, or a list of parts (ObjectRefs or
    values), each a weights dict (merged) or an :class:`AdamWState` (at most one).

    Raises:
        ValueError: two optimizer states.
    """
    if isinstance(parts, Mapping):
        return dict(parts), None
    weights: dict[str, Any] = {}
    optimizer = None
    for part in parts:
        value = resolve(part)
        if isinstance(value, AdamWState):
            if optimizer is not None:
                raise ValueError("snapshot has two optimizer states")
            optimizer = value
        else:
            weights.update(value)
    return weights, optimizer


def load_snapshot(model: torch.nn.Module, weights: Mapping[str, Any]) -> None:
    """Copy every tensor of ``model``'s state dict from ``weights`` (cast to the tensor's dtype and device).

    Args:
        model: the module to load into.
        weights: name → array (numpy or torch, any float dtype); see the module docstring for the names.

    Raises:
        ValueError: a key the model does not have, a model tensor with none of its names in ``weights``,
            or a tensor of another shape; each names the key.
    """
    state = dict(weights)
    if state and all(k.startswith("module.") for k in state):
        state = {k[len("module.") :]: v for k, v in state.items()}
    own = model.state_dict(keep_vars=True)
    groups: dict[int, list[str]] = {}  # tied tensors share storage: one group, any of its names loads it
    for name, tensor in own.items():
        groups.setdefault(tensor.data_ptr(), []).append(name)
    unexpected = sorted(k for k in state if k not in own and not OPTIONAL_KEYS.search(k))
    if unexpected:
        raise ValueError(f"weights have keys the model does not: {unexpected[:5]} ({len(unexpected)} in all)")
    with torch.no_grad():
        for names in groups.values():
            present = [n for n in names if n in state]
            if not present:
                if all(OPTIONAL_KEYS.search(n) for n in names):
                    continue
                raise ValueError(f"weights lack {names[0]!r} (and its tied names {names[1:]})")
            raw = state[present[0]]
            # np.array copies: arrays from ray.get are read-only and torch wants writable memory.
            value = raw if torch.is_tensor(raw) else torch.from_numpy(np.array(raw))
            target = own[names[0]]
            if tuple(value.shape) != tuple(target.shape):
                raise ValueError(f"weights {present[0]!r} have shape {tuple(value.shape)}, model {tuple(target.shape)}")
            target.copy_(value.to(device=target.device, dtype=target.dtype))
