"""The planted-batch positive control: one batch of each branched chunk is replaced by a broken copy.

    chunk (L batches, stream order) ─► planted_index(seed, chunk) = i ─► batch i ─► plant_batch ─► the planted chunk
                                                                                    │
        shuffled: each row's real tokens (t < n_tokens) permuted within the row     │ lengths, padding and
        repeated: each real token replaced by one id (drawn from the batch's own)   │ loss masks unchanged

The census then orders and trains the planted chunk like any other (S, D3's order and every branch see
it), and the report asks where the planted batch's position in an order moves the held-out loss
(``d3ray.lab.census.stats.position_effect``): an effect the census must find before its null on D3 means
anything. Pure functions, no Ray and no torch.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

PLANTED_KINDS = ("shuffled", "repeated")


def planted_index(L: int, seed: int, chunk_id: int, fixed: int | None = None) -> int:
    """The stream index (0..L−1) of the batch planted in chunk ``chunk_id``: ``fixed`` if given, else a
    fixed draw per (seed, chunk).

    Raises:
        ValueError: ``fixed`` outside 0..L−1.
    """
    if fixed is not None:
        if not 0 <= fixed < L:
            raise ValueError(f"planted batch {fixed} is not a stream index 0..{L - 1}")
        return int(fixed)
    return int(np.random.default_rng([seed, chunk_id, 0x91A7]).integers(L))


def planting(kind: str, L: int, seed: int, chunk_id: int, fixed: int | None = None) -> dict[str, Any]:
    """What is planted in chunk ``chunk_id`` (written to the chunk's ``orders.json``; a census directory
    never mixes branches of planted and unplanted chunks): ``{"kind", "index", "seed"}``."""
    if kind not in PLANTED_KINDS:
        raise ValueError(f"planted kind {kind!r}: one of {', '.join(PLANTED_KINDS)}")
    return {"kind": kind, "index": planted_index(L, seed, chunk_id, fixed), "seed": [int(seed), int(chunk_id)]}


def plant_tokens(input_ids: np.ndarray, n_tokens: np.ndarray, kind: str, seed: Any) -> np.ndarray:
    """A (B, T) token array with each row's real tokens (positions t < n_tokens[b]) broken: ``shuffled``
    permutes them within the row, ``repeated`` replaces every one by a single id drawn from the batch's real
    tokens. Padding positions keep their ids; the input is not modified; the same seed gives the same array.

    Example (shuffled): row (5, 6, 7, 0) with n_tokens 3 → a permutation of (5, 6, 7), then 0.

    Raises:
        ValueError: an unknown kind, or shapes that do not agree.
    """
    ids = np.asarray(input_ids)
    n = np.asarray(n_tokens).reshape(-1)
    if ids.ndim != 2 or n.shape[0] != ids.shape[0]:
        raise ValueError(f"input_ids must be (B, T) with one n_tokens per row, got {ids.shape} and {n.shape}")
    if kind not in PLANTED_KINDS:
        raise ValueError(f"planted kind {kind!r}: one of {', '.join(PLANTED_KINDS)}")
    rng = np.random.default_rng(seed)
    out = ids.copy()
    if kind == "shuffled":
        for b in range(ids.shape[0]):
            k = int(min(n[b], ids.shape[1]))
            out[b, :k] = ids[b, :k][rng.permutation(k)]
        return out
    real = np.arange(ids.shape[1])[None, :] < n[:, None]
    if real.any():
        out[real] = rng.choice(ids[real])
    return out


def plant_batch(batch: Any, kind: str, seed: Any) -> Any:
    """``batch`` (a ``GlobalBatch``) with its tokens broken by :func:`plant_tokens`; n_tokens, loss_mask,
    sample ids and domains unchanged."""
    return replace(batch, input_ids=plant_tokens(batch.input_ids, batch.n_tokens, kind, seed).astype(
        np.asarray(batch.input_ids).dtype, copy=False))


def plant_chunk(batches: list[Any], plant: dict[str, Any]) -> list[Any]:
    """The chunk's batches with batch ``plant["index"]`` planted (a new list; the others are the same
    objects)."""
    out = list(batches)
    i = int(plant["index"])
    out[i] = plant_batch(out[i], plant["kind"], plant["seed"])
    return out


def planted_orders(L: int, index: int) -> dict[str, tuple[int, ...]]:
    """Two control orders: the stream order with the planted batch moved first (``planted_first``) and
    last (``planted_last``).

    Example: L = 4, index 2 → planted_first (2, 0, 1, 3), planted_last (0, 1, 3, 2).
    """
    rest = tuple(i for i in range(L) if i != index)
    return {"planted_first": (index, *rest), "planted_last": (*rest, index)}
