"""The seeded streaming shuffle of a lane (:class:`ShuffleBuffer`), with a JSON-safe state.

    lane's reader ──► push(seq) ──► [ pool of ``size`` sequences ] ──► a random one leaves once full
    end of the epoch ──► pop() until empty            (size 0 or 1: every sequence leaves as it comes)

The state is the RNG state plus the sequences the pool holds (base64 tokens, and an SFT loss mask as
packed bits): ``shuffle_buffer`` x T x 4 bytes x 4/3 of JSON.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

from d3ray.data.packing import PackedSequence, decode_tokens, encode_tokens


class ShuffleBuffer:
    """Seeded streaming shuffle with a buffer of ``size`` items (0 or 1: unchanged order), with a
    JSON-safe state. ``push`` returns the item that leaves (once the buffer is full), ``pop`` drains."""

    def __init__(self, size: int, seed: list[int], state: dict[str, Any] | None = None) -> None:
        self.size = size
        self._rng = np.random.default_rng(seed)
        self._pool: list[PackedSequence] = []
        if state is not None and size > 1:
            self._rng.bit_generator.state = state["rng"]
            self._pool = [_sequence_from_dict(d) for d in state["pool"]]

    def push(self, item: PackedSequence) -> PackedSequence | None:
        if self.size <= 1:
            return item
        self._pool.append(item)
        return self.pop() if len(self._pool) >= self.size else None

    def pop(self) -> PackedSequence | None:
        if not self._pool:
            return None
        j = int(self._rng.integers(len(self._pool)))
        self._pool[j], self._pool[-1] = self._pool[-1], self._pool[j]
        return self._pool.pop()

    def state(self) -> dict[str, Any] | None:
        if self.size <= 1:
            return None
        return {"rng": self._rng.bit_generator.state, "pool": [_sequence_to_dict(s) for s in self._pool]}


def _sequence_to_dict(seq: PackedSequence) -> dict[str, Any]:
    out = {"tokens": encode_tokens(seq.tokens), "domain": seq.domain, "sample_id": seq.sample_id,
           "n_tokens": int(seq.n_tokens)}
    mask = seq.loss_mask
    if mask is not None:  # SFT: (T,) bool as base64 of packed bits
        out["loss_mask"] = base64.b64encode(np.packbits(np.asarray(mask, dtype=bool)).tobytes()).decode()
    return out


def _sequence_from_dict(data: dict[str, Any]) -> PackedSequence:
    tokens = decode_tokens(data["tokens"])
    mask = None
    if "loss_mask" in data:
        bits = np.frombuffer(base64.b64decode(data["loss_mask"]), dtype=np.uint8)
        mask = np.unpackbits(bits)[: len(tokens)].astype(bool)
    return PackedSequence(tokens, data["domain"], data["sample_id"], int(data["n_tokens"]), mask)
