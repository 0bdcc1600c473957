"""What a chunk stream reads: a sequence source, and the per-epoch readers it opens (two Protocols).

    SequenceSource.reader(epoch, lane, state) ──► SequenceReader: PackedSequence, ... ; .state() = cursor
         │                                            │
         ├─ CorpusSource (corpus_source.py)          ├─ CorpusReader: a Ray Data stream; resumes by seeking
         │    packed pre-training sequences          │    to its state; .group: where its block started
         └─ IterableSource (iterable_source.py)      └─ IterableReader: a Python iterator; resumes by
              SFT records / in-memory sequences           reading again and dropping what was taken

A **lane** is a reader's view of the corpus: ``lane=None`` reads every domain, ``lane=<domain>`` one
domain. :class:`~d3ray.data.lane.Lane` strings a lane's readers across epochs;
:class:`~d3ray.data.domain_lanes.DomainLanes` serves each domain of a mixed stream; both, and
:class:`~d3ray.data.chunker.ChunkStream`, use only the members declared here.

The optional capability is a member, not an attribute to probe for: ``shares_readers`` says whether
one all-domain reader of the source can feed per-domain queues (its readers' ``group`` says where each
sequence's block starts, so that a domain can leave the shared reader for a lane of its own). A reader of
a source that does not share readers raises a clear error from ``group``; ``DomainLanes`` refuses such a
source with a shared reader before it opens one.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from d3ray.data.ledger import BadRecordLedger
    from d3ray.data.packing import PackedSequence


class ReaderGroup(Protocol):
    """Where one group of a reader's sequences starts (:class:`~d3ray.data.corpus_source.ReadGroup`)."""

    def state(self, domain: str | None = None, skip: int = 0) -> dict[str, Any]:
        """A reader state at this group: of the all-domain reader (``domain`` None) or of ``domain``'s lane,
        with ``skip`` of the group's sequences (of that domain) already taken."""
        ...


class SequenceReader(Protocol):
    """One epoch of one lane: iterates packed sequences, with a JSON-safe, resumable state.

    ``source.reader(epoch, lane, reader.state())`` continues exactly where ``reader`` stands.
    """

    near_end: bool
    """Whether the reader has reached the part of its epoch from which the next epoch is pre-started."""

    records_read: int
    """Records (good and bad) this reader took from its files, where it counts them (else 0)."""

    def __iter__(self) -> Iterator[PackedSequence]: ...

    def __next__(self) -> PackedSequence: ...

    def state(self) -> dict[str, Any]:
        """JSON-safe position of the next sequence."""
        ...

    @property
    def group(self) -> ReaderGroup:
        """The group of the sequence last handed out (before the first: where the reader starts).

        Raises:
            TypeError: the reader's source does not share readers (``shares_readers`` is False).
        """
        ...

    def prestart(self) -> None:
        """Start reading in the background now (a no-op where starting costs nothing)."""
        ...

    def close(self) -> None:
        """Stop reading now, rather than when the reader is collected (a no-op where nothing runs)."""
        ...


class SequenceSource(Protocol):
    """Opens the readers of a corpus or record set, per (epoch, lane, state).

    Plain and picklable: a chunk stream is built on the driver and read in the coordinator actor.
    """

    ledger: BadRecordLedger
    """The bad-record ledger the run's data report reads; this source's readers count into it."""

    shares_readers: bool
    """Whether one all-domain reader can serve several domains of a mixed stream (its readers' ``group``
    works); False: every domain of a mixed stream reads on a lane of its own."""

    @property
    def domains(self) -> list[str]:
        """The domains (lanes), in a stable order."""
        ...

    @property
    def shared_span_blocks(self) -> int:
        """Mixed streams: how many blocks the shared reader's queues may span by default (0: a lane per
        domain; always 0 where ``shares_readers`` is False)."""
        ...

    def reader(self, epoch: int, lane: str | None, state: dict[str, Any] | None) -> SequenceReader:
        """A reader of one epoch of ``lane`` (None: all domains), at ``state`` (None: the epoch's start)."""
        ...

    def with_ledger(self, ledger: BadRecordLedger) -> SequenceSource:
        """The same source, its readers counting into ``ledger`` (a lane whose records the shared
        reader already counts into the run's ledger)."""
        ...
