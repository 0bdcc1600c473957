"""One lane across epochs (:class:`Lane`): a reader per epoch, a seeded shuffle per epoch, the pre-start.

    source.reader(epoch, lane, state) ──► ShuffleBuffer([*seed_key, epoch]) ──► next() ... None (epoch over)
        near the end of an epoch (reader.near_end): source.reader(epoch + 1, lane, None).prestart()

**Epoch pre-start.** A Ray Data stream starts its tasks (or tokenizer actors) and reads its first shard
before its first block arrives (seconds). When a reader reaches the last quarter of its shards (at least
the last shard; ``CorpusReader.near_end``), its lane starts the next epoch's reader in a background
thread, so that the epoch boundary costs no more than any block. The pre-started stream reads ahead
until Ray Data's backpressure stops it; its work is the next epoch's, so nothing is read twice.

**State:** ``{"epoch", "reader": the reader's state, "shuffle": the ShuffleBuffer's state}``.
"""

from __future__ import annotations

from typing import Any

from d3ray.data.packing import PackedSequence
from d3ray.data.shuffle import ShuffleBuffer
from d3ray.data.source import SequenceReader, SequenceSource


class Lane:
    """One lane across epochs: a reader per epoch, a seeded shuffle per epoch, and the pre-start.

    Args:
        source: opens the readers (a :class:`~d3ray.data.source.SequenceSource`).
        lane: the domain of a per-domain lane, None for all domains.
        shuffle_buffer: sequences in the shuffle buffer (0 = stream order).
        seed_key: the shuffle of epoch e is seeded with ``[*seed_key, e]``.
        state: a :meth:`state` to resume from (None: epoch 0 from the start).
    """

    def __init__(self, source: SequenceSource, lane: str | None, shuffle_buffer: int, seed_key: list[int],
                 state: dict[str, Any] | None = None) -> None:
        self.source, self.lane = source, lane
        self.shuffle_buffer, self.seed_key = shuffle_buffer, list(seed_key)
        self.epoch = int(state["epoch"]) if state else 0
        self._reader = source.reader(self.epoch, lane, state["reader"] if state else None)
        self._shuffle = ShuffleBuffer(shuffle_buffer, [*self.seed_key, self.epoch], state["shuffle"] if state else None)
        self._reader_done = False
        self._next_reader: SequenceReader | None = None
        self.records_read: dict[int, int] = {}  # epoch -> records its reader took (when it is done)

    @property
    def prestarted(self) -> bool:
        """Whether the next epoch's reader is already started."""
        return self._next_reader is not None

    def next(self) -> PackedSequence | None:
        """The next sequence of the current epoch, or None when the epoch is over; the lane then
        stands at the start of the next epoch (pre-started when the old one reached its last shard)."""
        while not self._reader_done:
            seq = next(self._reader, None)
            if self._next_reader is None and self._reader.near_end:
                self._next_reader = self.source.reader(self.epoch + 1, self.lane, None)
                self._next_reader.prestart()
            if seq is None:
                self._reader_done = True
                break
            out = self._shuffle.push(seq)
            if out is not None:
                return out
        out = self._shuffle.pop()
        if out is not None:
            return out
        self.records_read[self.epoch] = self._reader.records_read
        self.epoch += 1
        self._reader = self._next_reader or self.source.reader(self.epoch, self.lane, None)
        self._next_reader = None
        self._shuffle = ShuffleBuffer(self.shuffle_buffer, [*self.seed_key, self.epoch])
        self._reader_done = False
        return None

    def prestart(self) -> None:
        """Start the current reader's Ray Data stream in the background (lanes start in parallel)."""
        self._reader.prestart()

    def close(self) -> None:
        """Stop this lane's streams (the current and the pre-started one)."""
        for reader in (self._reader, self._next_reader):
            if reader is not None:
                reader.close()
        self._next_reader = None

    def state(self) -> dict[str, Any]:
        """JSON-safe state: ``{"epoch", "reader": SequenceReader.state(), "shuffle": ...}``."""
        return {"epoch": self.epoch, "reader": self._reader.state(), "shuffle": self._shuffle.state()}
