"""The per-domain sequence streams of a mixed chunk stream: one shared reader, lanes where it must.

A mixer draws each slot's domain and takes that domain's next sequence. Domain d's stream is fixed
by the data alone: d's documents in corpus order, packed per domain, shuffled per domain epoch with
``[seed, 1 + index(d), epoch]`` (``d3ray.data.lane.Lane``). Two ways to produce it:

* a **lane** of its own (``Lane(source, d, ...)``): a Ray Data stream that reads every shard that can
  hold d and tokenizes only d's documents; it moves at d's pace, whatever the mixture;
* the **shared reader**: one all-domain reader (the plain stream's, ``source.reader(epoch, None,
  ...)``) whose sequences go to per-domain queues. The corpus is read and tokenized once for all
  domains, so a mixture near the natural proportions costs what the unmixed stream costs.

Both give d exactly the same sequences in the same order (packing is per domain), so a domain can
move from the shared reader to a lane at any time without changing what is drawn. The shared reader
keeps every domain it serves; a domain leaves it when the mixture outruns what the shared reader
can give without holding too much: when d is wanted, its queue is empty, and the queues of the
others span more than ``span_blocks`` blocks of the corpus, d (the starved domain) gets a lane of
its own from where its next sequence is, and the shared reader goes on for the rest. The last
domain of the shared reader stays (it reads the whole corpus anyway, and counts every record into
the run's ledger). ``span_blocks = 0``: a lane per domain from the start (no shared reader).

**State** (``state()``, inside the mixed cursor): ``{"lanes": {domain: LANE}, "shared": null |
{"epoch", "reader", "skip": {domain: n}}}``. Every domain's LANE is a valid lane state (a lane started
from it continues that domain exactly), for shared domains too; ``shared`` restarts the shared reader
at the block of the oldest queued sequence (``reader``, a :class:`~d3ray.data.corpus_source.ReadGroup`
state), where each shared domain drops its first ``skip`` sequences (taken before the cursor). A
resume re-reads at most the span of the queues (< ``span_blocks`` + 1 blocks) plus, per lane, one
block. A cursor without ``shared`` (one lane per domain) resumes its lanes and shares the rest.

**Ledger.** The shared reader counts every record it reads into ``source.ledger`` (each record once
per epoch); a domain's own lane counts into a ledger of its own (its ``max_bad_fraction`` check
still applies), since the shared reader reads and counts those records too.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from typing import Any

from d3ray.data.lane import Lane
from d3ray.data.ledger import BadRecordLedger
from d3ray.data.packing import PackedSequence
from d3ray.data.shuffle import ShuffleBuffer
from d3ray.data.source import ReaderGroup, SequenceReader, SequenceSource

logger = logging.getLogger(__name__)


@dataclass
class _Group:
    """A group of the shared reader (see ``ReadGroup``) and the count of each domain's sequences
    pulled before it (so that a cursor can say how many of a domain's sequences from here were taken)."""

    number: int
    epoch: int
    read_group: ReaderGroup
    pulled_before: dict[str, int]


@dataclass
class _Queued:
    seq: PackedSequence
    epoch: int
    group: _Group
    ordinal: int  # its domain's sequences pulled before it (minus ``group.pulled_before``: its index in the group)


class _SharedDomain:
    """A domain served by the shared reader: its queue, its domain epoch and its shuffle."""

    def __init__(self, epoch: int, shuffle: ShuffleBuffer) -> None:
        self.queue: deque[_Queued] = deque()
        self.epoch = epoch
        self.shuffle = shuffle
        self.reader_done = False  # its epoch's sequences are all out of the queue


class DomainLanes:
    """Each domain's next sequence for the mixed chunk stream (see the module docstring).

    Args:
        source: the sequence source; with ``span_blocks`` > 0 one whose readers can be shared
            (``shares_readers``: a :class:`~d3ray.data.corpus_source.CorpusSource`).
        shuffle_buffer: sequences in each domain's shuffle buffer (0 = stream order).
        seed: the run seed; domain d's shuffle of epoch e is seeded ``[seed, 1 + index(d), e]``.
        span_blocks: how many blocks the shared reader's queues may span before a starved domain gets
            its own lane; 0 = a lane per domain, no shared reader.
        state: a :meth:`state` to resume from (None: every domain at its start).
    """

    def __init__(self, source: SequenceSource, shuffle_buffer: int, seed: int, span_blocks: int,
                 state: dict[str, Any] | None = None) -> None:
        if span_blocks > 0 and not source.shares_readers:
            raise ValueError(f"a shared reader (span_blocks={span_blocks}) needs a source that shares its readers; "
                             f"{type(source).__name__} reads each domain on a lane of its own: pass span_blocks=0")
        self.source, self.shuffle_buffer, self.seed, self.span_blocks = source, shuffle_buffer, seed, span_blocks
        self.domains = list(source.domains)
        state = state or {"lanes": {}, "shared": None}
        for domain in state["lanes"]:
            if domain not in self.domains:
                raise ValueError(f"data cursor holds a lane for unknown domain {domain!r}; known: {self.domains}")
        shared_state = state.get("shared")
        self.lanes: dict[str, Lane] = {}
        """The domains on lanes of their own."""
        self.shared: dict[str, _SharedDomain] = {}
        """The domains the shared reader serves."""
        self.moved_to_lanes: list[str] = []
        """Domains that left the shared reader for a lane of their own, in order (logged)."""
        if span_blocks > 0:
            shared_names = (list(shared_state["skip"]) if shared_state is not None
                            else [d for d in self.domains if d not in state["lanes"]])
        else:
            shared_names = []
        for domain in self.domains:
            lane_state = state["lanes"].get(domain)
            if domain in shared_names:
                epoch = int(lane_state["epoch"]) if lane_state else 0
                self.shared[domain] = _SharedDomain(epoch, ShuffleBuffer(
                    shuffle_buffer, self._seed_key(domain, epoch), lane_state["shuffle"] if lane_state else None))
            elif lane_state is not None:
                self.lanes[domain] = self._lane(domain, lane_state)
        self._pulled = dict.fromkeys(self.domains, 0)
        self._skip = {d: int(n) for d, n in shared_state["skip"].items()} if shared_state else {}
        # The cursor's lane states of the shared domains: still theirs while they drop what they took
        # before it, or while their epoch ended before the shared reader's.
        self._resumed = {d: state["lanes"][d]["reader"] for d in self.shared if d in state["lanes"]}
        self._epoch_end: dict[int, tuple[_Group, dict[str, int]]] = {}  # epoch -> its last group, pulls at its end
        self._group: _Group | None = None
        self._groups = 0
        self._span_ok_at = -1  # the group at which the span was last found within bounds
        self._reader: SequenceReader | None = None  # the shared reader (when some domain is shared)
        self._next_reader: SequenceReader | None = None
        if self.shared:
            self._epoch = int(shared_state["epoch"]) if shared_state else 0
            self._reader = source.reader(self._epoch, None, shared_state["reader"] if shared_state else None)

    # ---- the lane interface the chunk stream uses -----------------------------------------
    def epoch(self, domain: str) -> int:
        """The domain's current epoch (of the sequence it last returned)."""
        if domain in self.shared:
            return self.shared[domain].epoch
        return self.lanes[domain].epoch

    def next(self, domain: str) -> PackedSequence | None:
        """The domain's next sequence, or None when its epoch is over (it then stands at the next one)."""
        if domain in self.shared:
            out = self._next_shared(domain)
            if out is not _MOVED:
                return out
        if domain not in self.lanes:
            self.lanes[domain] = self._lane(domain, None)
        return self.lanes[domain].next()

    def prestart(self, domain: str) -> None:
        """Start reading for ``domain`` in the background (its lane, or the shared reader)."""
        if domain in self.shared:
            assert self._reader is not None  # shared domains have the shared reader
            self._reader.prestart()
            return
        if domain not in self.lanes:
            self.lanes[domain] = self._lane(domain, None)
        self.lanes[domain].prestart()

    def close(self) -> None:
        """Stop every Ray Data stream (the shared reader's, the pre-started one and every lane's)."""
        for reader in (self._reader, self._next_reader):
            if reader is not None:
                reader.close()
        self._next_reader = None
        for lane in self.lanes.values():
            lane.close()

    def state(self) -> dict[str, Any]:
        """JSON-safe state (see the module docstring)."""
        lanes = {d: lane.state() for d, lane in self.lanes.items()}
        if not self.shared:
            return {"lanes": lanes, "shared": None}
        current = self._current_group()
        heads = [s.queue[0].group for s in self.shared.values() if s.queue]
        oldest = min(heads, key=lambda g: g.number) if heads else current
        skip = {}
        for domain, s in self.shared.items():
            at = s.queue[0].ordinal if s.queue else self._pulled[domain]
            skip[domain] = at - oldest.pulled_before[domain] + self._skip.get(domain, 0)
            lanes[domain] = {"epoch": s.epoch, "reader": self._lane_reader_state(domain, s, current),
                             "shuffle": s.shuffle.state()}
        return {"lanes": lanes, "shared": {"epoch": oldest.epoch, "reader": oldest.read_group.state(), "skip": skip}}

    # ---- the shared reader -----------------------------------------------------------------
    def _next_shared(self, domain: str) -> Any:
        s = self.shared[domain]
        while not s.reader_done:
            item = self._take(domain, s)
            if item is _MOVED:
                return _MOVED
            if item is None:
                s.reader_done = True
                break
            out = s.shuffle.push(item.seq)
            if out is not None:
                return out
        out = s.shuffle.pop()
        if out is not None:
            return out
        s.epoch += 1
        s.shuffle = ShuffleBuffer(self.shuffle_buffer, self._seed_key(domain, s.epoch))
        s.reader_done = False
        return None

    def _take(self, domain: str, s: _SharedDomain) -> _Queued | None | object:
        """The domain's next queued sequence of its epoch, pulling from the shared reader as needed;
        None at the end of its epoch; ``_MOVED`` when the domain was just given a lane of its own."""
        while True:
            if s.queue:
                return s.queue.popleft() if s.queue[0].epoch == s.epoch else None
            if self._epoch > s.epoch:  # the shared reader is past this domain's epoch
                return None
            if len(self.shared) > 1 and self._over_span():
                self._move_to_lane(domain, s)
                return _MOVED
            self._pull()

    def _pull(self) -> None:
        """One sequence from the shared reader into its domain's queue (or the next epoch's reader)."""
        assert self._reader is not None
        seq = next(self._reader, None)
        if self._next_reader is None and self._reader.near_end:
            self._next_reader = self.source.reader(self._epoch + 1, None, None)
            self._next_reader.prestart()
        if seq is None:
            self._epoch_end[self._epoch] = (self._current_group(), dict(self._pulled))
            self._epoch += 1
            self._reader = self._next_reader or self.source.reader(self._epoch, None, None)
            self._next_reader = None
            self._group = None
            return
        group = self._current_group()
        domain = seq.domain
        ordinal = self._pulled[domain]
        self._pulled[domain] = ordinal + 1
        if self._skip.get(domain, 0) > 0:  # taken before the cursor this stream resumed from
            self._skip[domain] -= 1
            return
        s = self.shared.get(domain)
        if s is not None:
            s.queue.append(_Queued(seq, self._epoch, group, ordinal))

    def _current_group(self) -> _Group:
        assert self._reader is not None
        read_group = self._reader.group
        if self._group is None or self._group.read_group is not read_group:
            self._group = _Group(self._groups, self._epoch, read_group, dict(self._pulled))
            self._groups += 1
        return self._group

    def _over_span(self) -> bool:
        """Whether the queues reach back more than ``span_blocks``. Within one group the span only
        shrinks (sequences leave the queues; new ones are of this group), so one check per group that
        finds it within bounds holds until the next group."""
        number = self._current_group().number
        if number == self._span_ok_at:
            return False
        if self._span() > self.span_blocks:
            return True
        self._span_ok_at = number
        return False

    def _span(self) -> int:
        """Blocks between the oldest queued sequence and the shared reader's current block."""
        heads = [s.queue[0].group.number for s in self.shared.values() if s.queue]
        return self._current_group().number - min(heads) if heads else 0

    def _lane_reader_state(self, domain: str, s: _SharedDomain, current: _Group) -> dict[str, Any]:
        """The state of a lane of ``domain`` that continues it exactly (its reader's part)."""
        if self._skip.get(domain, 0) > 0:
            return self._resumed[domain]
        if s.queue:
            head = s.queue[0]
            if head.epoch == s.epoch:
                return head.group.read_group.state(domain, head.ordinal - head.group.pulled_before[domain])
        elif self._epoch == s.epoch:
            return current.read_group.state(domain, self._pulled[domain] - current.pulled_before[domain])
        # The domain's epoch is all pulled (its shuffle may still hold some): the end of that epoch.
        if s.epoch not in self._epoch_end:  # it ended before this stream resumed
            return self._resumed[domain]
        last, pulled = self._epoch_end[s.epoch]
        return last.read_group.state(domain, pulled[domain] - last.pulled_before[domain])

    def _move_to_lane(self, domain: str, s: _SharedDomain) -> None:
        state = {"epoch": s.epoch, "reader": self._lane_reader_state(domain, s, self._current_group()),
                 "shuffle": s.shuffle.state()}
        del self.shared[domain]
        self.lanes[domain] = lane = self._lane(domain, state)
        lane.prestart()
        self.moved_to_lanes.append(domain)
        logger.info("domain %s: the mixture outruns the shared reader (its queues span %d blocks > %d); "
                    "it reads on a lane of its own from here", domain, self._span(), self.span_blocks)

    def _lane(self, domain: str, state: dict[str, Any] | None) -> Lane:
        source = self.source
        if self.span_blocks > 0:  # the shared reader counts this domain's records into the run's ledger
            source = source.with_ledger(BadRecordLedger(log_first=0))
        return Lane(source, domain, self.shuffle_buffer, [self.seed, 1 + self.domains.index(domain)], state)

    def _seed_key(self, domain: str, epoch: int) -> list[int]:
        return [self.seed, 1 + self.domains.index(domain), epoch]


_MOVED = object()
