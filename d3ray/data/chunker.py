"""Packed sequences → global batches of B → chunks of L batches, deterministically and resumably.

A chunk is the unit the schedulers order (docs/design/system.md §1). Chunks depend only on
the data, the config, the seed and (when mixing) the mixture of each chunk, never on the number of
trainer workers: each global batch is later split across ranks by the trainers.

Plain (no mixer, ``mixture_for_chunk=None``):

    one lane, all domains ──(seeded shuffle buffer)──► batches of B ──► chunks of L (chunk_id 0, 1, ...)
    end of an epoch: the incomplete last batch is dropped and counted; the stream restarts
    (epoch + 1, pre-started) and the last chunk of the epoch may hold fewer than L batches.
    sample ids "<epoch>/<shard>:<line>:<offset>".

Mixed (``mixture_for_chunk(chunk_id) -> {domain: weight} | None``, None = keep the last one):

    a stream per domain (d3ray.data.domain_lanes: one shared reader, and lanes of their own for the
    domains the mixture starves it of) ─► each of the chunk's B x L slots draws its domain from the
    chunk's mixture (d3ray.data.mixture.draw_domains) and takes that domain's next sequence ─►
    batches of B ─► chunks of L. A domain that runs out starts its next domain epoch
    (counted in ``stats.domain_epochs``, logged); sample ids "<domain epoch>/<shard>:<line>:<offset>".
    There is no end: a mixed stream never drops a tail and every chunk holds L batches.

Every chunk carries ``cursor``: the stream's JSON-safe state at the chunk's start. A stream built
with ``cursor=chunk.cursor`` yields that chunk and the ones after it, identical to the uninterrupted
stream, without reading what came before (see d3ray/data/lane.py and the source's reader, e.g.
d3ray/data/corpus_source.py, for what the state holds).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from d3ray.data.domain_lanes import DomainLanes
from d3ray.data.lane import Lane
from d3ray.data.mixture import draw_domains, validate_mixture
from d3ray.data.packing import PackedSequence
from d3ray.data.source import SequenceSource

logger = logging.getLogger(__name__)

CURSOR_VERSION = 1

MixtureForChunk = Callable[[int], Mapping[str, float] | None]


@dataclass(frozen=True)
class GlobalBatch:
    """One optimizer step's sequences.

    Attributes:
        input_ids: (B, T) int32 token ids.
        n_tokens: (B,) valid tokens per row (< T only for a padded stream tail).
        sample_ids: B stable ids "<epoch>/<shard>:<line>:<offset>" (the domain's epoch when mixing).
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
    may hold fewer).

    Attributes:
        chunk_id: run-wide chunk id.
        epoch: the data epoch (mixed: the highest domain epoch among the chunk's sequences).
        batches: the global batches in stream order.
        capacity: batches per full chunk (the stream's chunk length): run-wide batch ids are
            ``chunk_id * capacity + i``.
        cursor: JSON-safe stream state at this chunk's start: ``ChunkStream(..., cursor=cursor)``
            yields this chunk first.
        mixture: the weights the chunk was drawn with (None for a plain stream).
    """

    chunk_id: int
    epoch: int
    batches: tuple[GlobalBatch, ...]
    capacity: int
    cursor: dict[str, Any] | None = None
    mixture: dict[str, float] | None = None

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


def total_chunks(steps: int, L: int) -> int:
    """Chunks a run of ``steps`` optimizer steps trains at chunk length ``L``: ⌈steps / L⌉ (the last one
    is cut short when L does not divide ``steps``). The one count of a run's chunks: schedules over
    training progress (``BuildContext.total_chunks``) and the trainers' in-trainer sketching read it."""
    return -(-steps // L)


def chunks_to_train(version: int, step: int, steps: int, L: int) -> int:
    """The chunks a run trains in all, seen after ``step`` steps when chunk ``version`` is next: the
    chunks before it plus ⌈(steps − step) / L⌉, and never fewer than :func:`total_chunks`. A chunk cut
    short where an epoch of the stream ends leaves steps for one more chunk than ⌈steps / L⌉; the
    trainers' scoring counts it here, so that chunk is scored like the others (with the fixed count it
    was never scored: it waited ``schedule.deadline_s`` and trained in its fallback order)."""
    return max(total_chunks(steps, L), version + -(-max(steps - step, 0) // L))


@dataclass
class ChunkStreamStats:
    """What the chunker dropped or restarted, so that nothing is lost silently."""

    dropped_tail_sequences: int = 0
    epochs_started: int = 0
    per_epoch_chunks: list[int] = field(default_factory=list)
    domain_epochs: dict[str, int] = field(default_factory=dict)
    """Mixed: domain epochs completed per domain (each restarted that domain's stream)."""
    domain_draws: dict[str, int] = field(default_factory=dict)
    """Mixed: sequences drawn per domain."""


def make_batch(sequences: Sequence[PackedSequence], epoch: int | Sequence[int]) -> GlobalBatch:
    """Stack packed sequences (``tokens``, ``n_tokens``, ``sample_id``, ``domain``, optional
    ``loss_mask``) into a batch; ``epoch`` is the epoch of all of them or one per sequence. A batch
    has a loss mask when any of its sequences has one; a sequence without one then gets
    ``position < n_tokens``."""
    per_seq = [epoch] * len(sequences) if isinstance(epoch, int) else list(epoch)
    input_ids = np.stack([np.asarray(s.tokens, dtype=np.int32) for s in sequences])
    n_tokens = np.asarray([s.n_tokens for s in sequences], dtype=np.int32)
    masks = [s.loss_mask for s in sequences]
    loss_mask = None
    if any(m is not None for m in masks):
        loss_mask = np.arange(input_ids.shape[1])[None, :] < n_tokens[:, None]  # (B, T)
        for row, m in enumerate(masks):
            if m is not None:
                loss_mask[row] = np.asarray(m, dtype=bool)
    return GlobalBatch(
        input_ids=input_ids,
        n_tokens=n_tokens,
        sample_ids=tuple(f"{e}/{s.sample_id}" for s, e in zip(sequences, per_seq, strict=True)),
        domains=tuple(s.domain for s in sequences),
        loss_mask=loss_mask,
    )


class ChunkStream:
    """Iterates chunks from a corpus source, plain or mixed, from the start or from a cursor.

    Args:
        source: opens per-epoch sequence readers (a :class:`~d3ray.data.source.SequenceSource`: a
            :class:`~d3ray.data.corpus_source.CorpusSource` or an :class:`~d3ray.data.iterable_source.IterableSource`).
        batch_size: B, sequences per global batch.
        chunk_len: L, batches per chunk.
        shuffle_buffer: seeded streaming shuffle of sequences (0 = off); per lane when mixing.
        seed: run seed; the plain shuffle of epoch e uses ``(seed, e)``.
        mixture_for_chunk: the mixer's decision per chunk id (None: a plain, mixture-less stream).
            It must give the same answer for the same chunk id on every call (resume relies on it).
        cursor: a ``Chunk.cursor`` to start from (None: chunk 0 of epoch 0).
        shared_span_blocks: mixed streams: how far (in blocks) the shared reader's per-domain queues may
            reach before a starved domain gets a lane of its own (d3ray.data.domain_lanes); 0 = a lane per
            domain. Default: the source's ``shared_span_blocks`` (``data.mix_shared_span_blocks`` for a
            corpus; 0 for sources whose readers cannot be shared, e.g. SFT files).
    """

    def __init__(
        self,
        source: SequenceSource,
        batch_size: int,
        chunk_len: int,
        shuffle_buffer: int = 0,
        seed: int = 0,
        mixture_for_chunk: MixtureForChunk | None = None,
        cursor: dict[str, Any] | None = None,
        shared_span_blocks: int | None = None,
    ) -> None:
        self.source = source
        self.ledger = source.ledger
        self.batch_size = batch_size
        self.chunk_len = chunk_len
        self.shuffle_buffer = shuffle_buffer
        self.seed = seed
        self.mixture_for_chunk = mixture_for_chunk
        if cursor is not None:
            mode = "mixed" if mixture_for_chunk is not None else "plain"
            if cursor.get("version") != CURSOR_VERSION or cursor.get("mode") != mode:
                raise ValueError(
                    f"data cursor is version {cursor.get('version')!r} mode {cursor.get('mode')!r}; this "
                    f"stream needs version {CURSOR_VERSION} mode {mode!r} (a mixer cannot be added or removed on resume)"
                )
        self.cursor = cursor
        self.stats = ChunkStreamStats()
        self.shared_span_blocks = source.shared_span_blocks if shared_span_blocks is None else shared_span_blocks
        self.lanes: dict[str | None, Lane] = {}
        """The lanes being read: ``None`` (plain), or the domains on lanes of their own (mixed)."""
        self.domain_lanes: DomainLanes | None = None
        """Mixed: every domain's stream (the shared reader and the lanes)."""

    def close(self) -> None:
        """Stop the lanes' Ray Data streams now (a stream that is dropped stops when it is collected)."""
        if self.domain_lanes is not None:
            self.domain_lanes.close()  # the shared reader and every lane
            return
        for lane in self.lanes.values():
            lane.close()

    def __iter__(self) -> Iterator[Chunk]:
        if self.mixture_for_chunk is None:
            return self._plain_chunks()
        return self._mixed_chunks(self.mixture_for_chunk)

    # ---- plain ----------------------------------------------------------------------------
    def _plain_chunks(self) -> Iterator[Chunk]:
        B, L = self.batch_size, self.chunk_len
        lane = Lane(self.source, None, self.shuffle_buffer, [self.seed], self.cursor["lane"] if self.cursor else None)
        self.lanes = {None: lane}
        chunk_id = int(self.cursor["chunk_id"]) if self.cursor else 0
        from_start = self.cursor is None or bool(self.cursor["at_epoch_start"])
        while True:
            epoch = lane.epoch
            self.stats.epochs_started += 1
            produced = 0
            pending: list = []
            batches: list[GlobalBatch] = []
            start = self._plain_cursor(chunk_id, epoch, lane, at_epoch_start=from_start)
            while (seq := lane.next()) is not None:
                pending.append(seq)
                if len(pending) == B:
                    batches.append(make_batch(pending, epoch))
                    pending = []
                    if len(batches) == L:
                        yield Chunk(chunk_id=chunk_id, epoch=epoch, batches=tuple(batches), capacity=L, cursor=start)
                        chunk_id += 1
                        produced += 1
                        batches = []
                        start = self._plain_cursor(chunk_id, epoch, lane, at_epoch_start=False)
            if pending:
                self.stats.dropped_tail_sequences += len(pending)
                logger.info(
                    "epoch %d: dropped the last %d sequences (less than one global batch of %d)",
                    epoch, len(pending), B,
                )
            if batches:
                yield Chunk(chunk_id=chunk_id, epoch=epoch, batches=tuple(batches), capacity=L, cursor=start)
                chunk_id += 1
                produced += 1
            self.stats.per_epoch_chunks.append(produced)
            if produced == 0 and from_start:
                raise ValueError(
                    f"epoch {epoch} of the training data yields fewer than one global batch of "
                    f"{B} sequences; add data or lower train.global_batch_size"
                )
            from_start = True

    @staticmethod
    def _plain_cursor(chunk_id: int, epoch: int, lane: Lane, at_epoch_start: bool) -> dict[str, Any]:
        return {"version": CURSOR_VERSION, "mode": "plain", "chunk_id": chunk_id, "epoch": epoch,
                "at_epoch_start": at_epoch_start, "lane": lane.state()}

    # ---- mixed ----------------------------------------------------------------------------
    def _mixed_chunks(self, mixture_for_chunk: MixtureForChunk) -> Iterator[Chunk]:
        B, L = self.batch_size, self.chunk_len
        domains = list(self.source.domains)
        cursor = self.cursor or {"chunk_id": 0, "lanes": {}, "mixture": None}
        lanes = self.domain_lanes = DomainLanes(self.source, self.shuffle_buffer, self.seed, self.shared_span_blocks,
                                                {"lanes": cursor["lanes"], "shared": cursor.get("shared")})
        self.lanes = lanes.lanes
        started: set[str] = set()
        chunk_id = int(cursor["chunk_id"])
        mixture: dict[str, float] | None = cursor["mixture"]
        while True:
            start = {"version": CURSOR_VERSION, "mode": "mixed", "chunk_id": chunk_id, "mixture": mixture,
                     **lanes.state()}
            field_name = f"mixture_for_chunk({chunk_id})"
            decided = mixture_for_chunk(chunk_id)
            if decided is not None:
                mixture = validate_mixture(decided, domains, field_name)
            elif mixture is None:
                raise ValueError(f"{field_name} gave no mixture and no earlier chunk had one")
            for domain in [d for d in domains if mixture[d] > 0 and d not in started]:
                lanes.prestart(domain)  # start every lane of the mixture at once, not one by one
                started.add(domain)
            seqs, epochs = [], []
            for domain in draw_domains(mixture, domains, B * L, self.seed, chunk_id):
                seq = lanes.next(domain)
                if seq is None:  # this domain ran out: its stream starts its next epoch
                    self.stats.domain_epochs[domain] = self.stats.domain_epochs.get(domain, 0) + 1
                    logger.info("domain %s: epoch %d done at chunk %d; its stream restarts", domain,
                                lanes.epoch(domain) - 1, chunk_id)
                    seq = lanes.next(domain)
                    if seq is None:
                        raise ValueError(
                            f"{field_name}: domain {domain!r} has weight {mixture[domain]} but the corpus "
                            f"has no {domain} sequences"
                        )
                self.stats.domain_draws[domain] = self.stats.domain_draws.get(domain, 0) + 1
                seqs.append(seq)
                epochs.append(lanes.epoch(domain))
            batches = tuple(make_batch(seqs[i * B : (i + 1) * B], epochs[i * B : (i + 1) * B]) for i in range(L))
            yield Chunk(chunk_id=chunk_id, epoch=max(epochs), batches=batches, capacity=L, cursor=start,
                        mixture=dict(mixture))
            chunk_id += 1
