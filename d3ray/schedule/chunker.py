"""Packed sequences → global batches of B → chunks of L batches, deterministically.

A chunk is the unit the schedulers order (ARCHITECTURE.md section 2). Chunks depend only on
the data, the config and the seed, never on the number of trainer workers: each global batch
is later split across ranks by the trainers.

    sequences ──(seeded shuffle buffer)──► batches of B ──► chunks of L (chunk_id 0, 1, ...)
    end of an epoch: the incomplete last batch is dropped and counted; the stream restarts
    (epoch + 1) and the last chunk of the epoch may hold fewer than L batches.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GlobalBatch:
    """One optimizer step's sequences.

    Attributes:
        input_ids: (B, T) int32 token ids.
        n_tokens: (B,) valid tokens per row (< T only for a padded stream tail).
        sample_ids: B stable ids "<epoch>/<shard>:<line>:<offset>".
        domains: B domain labels.
        loss_mask: (B, T) bool targets of the loss (SFT), or None: every real token is a target.
            Labels come from ``d3ray.data.labels.lm_labels(input_ids, n_tokens, loss_mask)``.
    """

    input_ids: np.ndarray
    n_tokens: np.ndarray
    sample_ids: tuple[str, ...]
    domains: tuple[str, ...]
    loss_mask: np.ndarray | None = None

    def rows(self, rows: list[int] | np.ndarray) -> GlobalBatch:
        """A batch of some of this batch's rows (in the given order)."""
        idx = np.asarray(rows, dtype=np.int64)
        return GlobalBatch(
            input_ids=self.input_ids[idx], n_tokens=self.n_tokens[idx],
            sample_ids=tuple(self.sample_ids[i] for i in idx), domains=tuple(self.domains[i] for i in idx),
            loss_mask=None if self.loss_mask is None else self.loss_mask[idx],
        )


def concat_batches(parts: list[GlobalBatch]) -> GlobalBatch:
    """One batch of the rows of ``parts``, in order."""
    masks = [p.loss_mask for p in parts]
    return GlobalBatch(
        input_ids=np.concatenate([p.input_ids for p in parts]),
        n_tokens=np.concatenate([p.n_tokens for p in parts]),
        sample_ids=tuple(s for p in parts for s in p.sample_ids),
        domains=tuple(d for p in parts for d in p.domains),
        loss_mask=None if all(m is None for m in masks) else np.concatenate([
            m if m is not None else np.ones_like(p.input_ids, dtype=bool) for p, m in zip(parts, masks, strict=True)]),
    )


@dataclass(frozen=True)
class Chunk:
    """Up to ``capacity`` consecutive global batches with a run-wide id (the last chunk of an epoch
    may hold fewer)."""

    chunk_id: int
    epoch: int
    batches: tuple[GlobalBatch, ...]
    capacity: int
    """Batches per full chunk (the stream's chunk length): run-wide batch ids are ``chunk_id * capacity + i``."""

    @property
    def size(self) -> int:
        return len(self.batches)

    @property
    def batch_size(self) -> int:
        return len(self.batches[0].sample_ids) if self.batches else 0

    @property
    def batch_ids(self) -> tuple[int, ...]:
        """Run-wide ids of the chunk's batches (seeds of per-batch sampling, fault-drill targets)."""
        return tuple(self.chunk_id * self.capacity + i for i in range(self.size))

    def candidate(self, index: int) -> tuple[int, int]:
        """(batch, row) of flat candidate sequence ``index`` (``batch * B + row``)."""
        return divmod(index, self.batch_size)

    def gather(self, indices: tuple[int, ...] | list[int]) -> GlobalBatch:
        """A batch of the chunk's candidate sequences ``indices`` (flat), in that order."""
        B = self.batch_size
        return concat_batches([self.batches[i // B].rows([i % B]) for i in indices])


@dataclass
class ChunkStreamStats:
    """What the chunker dropped, so that nothing is lost silently."""

    dropped_tail_sequences: int = 0
    epochs_started: int = 0
    per_epoch_chunks: list[int] = field(default_factory=list)


def shuffled(items: Iterable, buffer: int, seed: list[int]) -> Iterator:
    """Seeded streaming shuffle with a buffer of ``buffer`` items (0 or 1 = unchanged order)."""
    if buffer <= 1:
        yield from items
        return
    rng = np.random.default_rng(seed)
    pool: list = []
    for item in items:
        pool.append(item)
        if len(pool) >= buffer:
            j = int(rng.integers(len(pool)))
            pool[j], pool[-1] = pool[-1], pool[j]
            yield pool.pop()
    while pool:
        j = int(rng.integers(len(pool)))
        pool[j], pool[-1] = pool[-1], pool[j]
        yield pool.pop()


def make_batch(sequences: list, epoch: int) -> GlobalBatch:
    """Stack packed sequences (``tokens``, ``n_tokens``, ``sample_id``, ``domain``, optional
    ``loss_mask``) into a batch. A batch has a loss mask when any of its sequences has one; a
    sequence without one then gets ``position < n_tokens``."""
    input_ids = np.stack([np.asarray(s.tokens, dtype=np.int32) for s in sequences])
    n_tokens = np.asarray([s.n_tokens for s in sequences], dtype=np.int32)
    masks = [getattr(s, "loss_mask", None) for s in sequences]
    loss_mask = None
    if any(m is not None for m in masks):
        loss_mask = np.arange(input_ids.shape[1])[None, :] < n_tokens[:, None]  # (B, T)
        for row, m in enumerate(masks):
            if m is not None:
                loss_mask[row] = np.asarray(m, dtype=bool)
    return GlobalBatch(
        input_ids=input_ids,
        n_tokens=n_tokens,
        sample_ids=tuple(f"{epoch}/{s.sample_id}" for s in sequences),
        domains=tuple(s.domain for s in sequences),
        loss_mask=loss_mask,
    )


class ChunkStream:
    """Iterates chunks over epochs from a factory of per-epoch sequence iterators.

    Args:
        sequences_for_epoch: ``epoch -> iterator of packed sequences`` (a fresh, deterministic stream).
        batch_size: B, sequences per global batch.
        chunk_len: L, batches per chunk.
        shuffle_buffer: seeded streaming shuffle of sequences (0 = off).
        seed: run seed; the shuffle of epoch e uses ``(seed, e)``.
        ledger: the data-quality ledger the source fills (reported by the coordinator), if any.
    """

    def __init__(
        self,
        sequences_for_epoch: Callable[[int], Iterable],
        batch_size: int,
        chunk_len: int,
        shuffle_buffer: int = 0,
        seed: int = 0,
        ledger: Any = None,
    ) -> None:
        self._source = sequences_for_epoch
        self.ledger = ledger
        self.batch_size = batch_size
        self.chunk_len = chunk_len
        self.shuffle_buffer = shuffle_buffer
        self.seed = seed
        self.stats = ChunkStreamStats()

    def __iter__(self) -> Iterator[Chunk]:
        chunk_id = 0
        epoch = 0
        while True:
            self.stats.epochs_started += 1
            produced = 0
            for batches in self._epoch_chunks(epoch):
                yield Chunk(chunk_id=chunk_id, epoch=epoch, batches=tuple(batches), capacity=self.chunk_len)
                chunk_id += 1
                produced += 1
            self.stats.per_epoch_chunks.append(produced)
            if produced == 0:
                raise ValueError(
                    f"epoch {epoch} of the training data yields fewer than one global batch of "
                    f"{self.batch_size} sequences; add data or lower train.global_batch_size"
                )
            epoch += 1

    def _epoch_chunks(self, epoch: int) -> Iterator[list[GlobalBatch]]:
        pending: list = []
        batches: list[GlobalBatch] = []
        seqs = shuffled(self._source(epoch), self.shuffle_buffer, [self.seed, epoch])
        for seq in seqs:
            pending.append(seq)
            if len(pending) == self.batch_size:
                batches.append(make_batch(pending, epoch))
                pending = []
                if len(batches) == self.chunk_len:
                    yield batches
                    batches = []
        if pending:
            self.stats.dropped_tail_sequences += len(pending)
            logger.info(
                "epoch %d: dropped the last %d sequences (less than one global batch of %d)",
                epoch, len(pending), self.batch_size,
            )
        if batches:
            yield batches
