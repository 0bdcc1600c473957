"""The iterable source: sequences from any deterministic per-epoch Python iterator (SFT records, sequences
held in memory), one lane per domain (a :class:`~d3ray.data.source.SequenceSource` and its readers).

    sequences_for(epoch, task or None, ledger) ──► PackedSequence, ... ──► IterableReader (drops another
        task's sequences; state = how many it took) ──► (the lane's ShuffleBuffer) ──► consumer

No seeking: a resumed reader reads its ``taken`` sequences again and drops them (fine for SFT sets;
pre-training corpora go through :class:`~d3ray.data.corpus_source.CorpusSource`). No shared reader
either (``shares_readers`` is False): a mixed stream reads each task on a lane of its own.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from d3ray.data.ledger import BadRecordLedger
from d3ray.data.packing import PackedSequence
from d3ray.data.source import ReaderGroup


class IterableSource:
    """A source over any deterministic per-epoch iterator of sequences (SFT records), with one lane per
    domain (the SFT task): no seeking, a reader's state is the number of sequences it took, and a resumed
    reader reads that many again and drops them (fine for SFT sets; pre-training corpora go through
    :class:`~d3ray.data.corpus_source.CorpusSource`).

    **Lanes.** ``reader(epoch, None, state)`` reads every sequence of the epoch; ``reader(epoch, task,
    state)`` only ``task``'s, in the order the whole stream has them (``sequences_for`` may leave the other
    tasks' records untokenized; this class drops any sequence of another domain it still yields). Each
    lane reads the files itself: they are small, and a lane then needs no other lane to move.

    **Ledger.** The plain lane (None) counts every epoch into ``ledger``, as one reader of the files. The
    per-task lanes all read the same files (every record of them, in the same order), so each record of an
    epoch is counted once, by whichever lane reads it first: a lane's reader counts into a
    :class:`_LaneLedger`, its own (which enforces ``max_bad_fraction`` on what it read, as the plain
    stream would), and passes to ``ledger`` the records beyond the furthest any lane of that epoch has read.

    Args:
        sequences_for: ``(epoch, task or None, ledger) -> iterator of PackedSequence``, the same for the
            same (epoch, task), counting the records it reads into ``ledger``.
        ledger: the bad-record ledger of the run's data report (a new one if None).
        domains: the tasks, in a stable order (``sft_task_counts``: sorted), or a function that lists them
            (called once, when a mixed stream first asks: a plain stream never reads them).
    """

    shares_readers = False
    shared_span_blocks = 0
    """Mixed streams: a lane per task (SFT files are small; a lane needs no other lane to move)."""

    def __init__(self, sequences_for: Callable[[int, str | None, BadRecordLedger], Iterator[PackedSequence]],
                 ledger: BadRecordLedger | None = None,
                 domains: Sequence[str] | Callable[[], Sequence[str]] = ()) -> None:
        self.sequences_for = sequences_for
        self.ledger = ledger if ledger is not None else BadRecordLedger()
        self._domains = domains
        self._read_upto: dict[int, int] = {}  # epoch -> records of it read by the furthest lane

    @property
    def domains(self) -> list[str]:
        if callable(self._domains):
            self._domains = list(self._domains())
        return list(self._domains)

    def reader(self, epoch: int, lane: str | None, state: dict[str, Any] | None) -> IterableReader:
        """A reader of one epoch of ``lane`` (a task; None: all of them), at ``state`` (None: the start)."""
        if lane is None:
            return IterableReader(iter(self.sequences_for(epoch, None, self.ledger)), _taken(state))
        if lane not in self.domains:
            raise ValueError(f"no lane for domain {lane!r}: the SFT training files have tasks {self.domains}")
        ledger = _LaneLedger(self.ledger, self._read_upto, epoch)
        sequences = (seq for seq in self.sequences_for(epoch, lane, ledger) if seq.domain == lane)
        return IterableReader(sequences, _taken(state))

    def with_ledger(self, ledger: BadRecordLedger) -> IterableSource:
        """This source, its readers counting into ``ledger``: its lanes count each record of an epoch once
        into it, whatever this source's lanes have read."""
        source = copy.copy(self)
        source.ledger, source._read_upto = ledger, {}
        return source


def _taken(state: dict[str, Any] | None) -> int:
    return int(state["taken"]) if state else 0


class _LaneLedger(BadRecordLedger):
    """One per-task lane's ledger of one epoch: every record it reads (its ``check``), and into ``shared``
    the records no lane of the epoch has read yet (lanes read the same records in the same order, so the
    n-th record one lane reads is the n-th any other reads; ``read_upto[epoch]``: the most any has read)."""

    def __init__(self, shared: BadRecordLedger, read_upto: dict[int, int], epoch: int) -> None:
        super().__init__(log_first=0)  # the shared ledger logs the bad records, once
        self._shared, self._read_upto, self._epoch = shared, read_upto, epoch
        self._read = 0

    def _first_read(self) -> bool:
        self._read += 1
        if self._read <= self._read_upto.get(self._epoch, 0):
            return False
        self._read_upto[self._epoch] = self._read
        return True

    def record_good(self, shard: str, count: int = 1) -> None:
        super().record_good(shard, count)
        new = sum(self._first_read() for _ in range(count))
        if new:
            self._shared.record_good(shard, new)

    def record_bad(self, shard: str, line: int, reason: str, detail: str = "") -> None:
        super().record_bad(shard, line, reason, detail)
        if self._first_read():
            self._shared.record_bad(shard, line, reason, detail)


class IterableReader:
    """One epoch of one lane of an :class:`IterableSource`; its state is the number of sequences taken.

    Args:
        sequences: the lane's sequences of the epoch, from the start.
        skip: sequences already taken (read again and dropped).
    """

    records_read = 0
    """Not counted here: ``sequences_for`` counts the records it reads into its ledger."""

    def __init__(self, sequences: Iterator[PackedSequence], skip: int) -> None:
        self._sequences = sequences
        self.taken = 0
        self.near_end = False
        for _ in range(skip):
            next(self._sequences)
            self.taken += 1

    @property
    def group(self) -> ReaderGroup:
        raise TypeError("an IterableSource reader has no read groups: its source does not share readers "
                        "(shares_readers is False), so a mixed stream reads each task on a lane of its own")

    def prestart(self) -> None:
        return None  # a Python iterator starts on its first sequence

    def close(self) -> None:
        return None  # nothing runs in the background

    def __iter__(self) -> IterableReader:
        return self

    def __next__(self) -> PackedSequence:
        seq = next(self._sequences)
        self.taken += 1
        return seq

    def state(self) -> dict[str, Any]:
        return {"taken": self.taken}
