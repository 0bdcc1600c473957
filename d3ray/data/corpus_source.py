"""The corpus source: packed pre-training sequences from the Ray Data reader, resumable by seeking, one epoch
of one lane at a time (a :class:`~d3ray.data.source.SequenceSource` and its readers).

A **lane** is one reader over the corpus: all domains (the plain, mixture-less stream) or one
domain (a per-domain stream for the mixers). Each epoch of a lane is a :class:`CorpusReader`:

    Ray Data stream from a position ──► iter_token_blocks (ledger) ──► SequencePacker.feed_block
        ──► sequences of the block, in completion order ──► (the lane's ShuffleBuffer, shuffle.py) ──► consumer

**State (the cursor).** A reader's state names the document that completes the next sequence:
its shard and :class:`~d3ray.data.shards.ShardPosition`, the packer's carried tokens just before
that document (< T per domain), and how many of the sequences it completes were already taken
(``SequencePacker.restart_point``). A reader started from that state seeks to the position (no
earlier line is read again; see ``ShardPosition`` for what a compressed shard decompresses again),
restores the packer, packs from there and drops what was taken, so it yields exactly the sequences
the old one would have yielded next; it tokenizes again at most that one document. (The lane's
:class:`~d3ray.data.shuffle.ShuffleBuffer` keeps its own state: see ``shuffle.py``.)

**Per-domain lanes** (mixing: the domains that the shared all-domain reader of
:class:`~d3ray.data.domain_lanes.DomainLanes` does not serve) each read the whole corpus through their
own Ray Data stream and keep only their domain's records (a byte probe skips the others' lines
without parsing them), so a lane moves through the corpus at its own pace and seeks on its own. Records of no known domain are
counted by the lane of ``cfg.domains[0]``. A lane reads and tokenizes in Ray tasks (no actors of its
own), ``max(1, tokenize_actors // len(domains))`` at once, of ``tokenize_cpus / len(domains)`` CPUs
each: all lanes together reserve what one plain stream's tokenizer tasks do.

**Epoch pre-start.** A reader is ``near_end`` from the last quarter of its shards on (at least the
last shard); its lane then starts the next epoch's reader in the background (``prestart``: the Ray Data
stream's tasks or actors and its first block, seconds), so that the epoch boundary costs no more than
any block (see ``lane.py``).

The bad-record ledger counts records as they are read: a resumed reader counts from its cursor
(its first block, re-read, is counted again by a ledger restored from a later checkpoint).
"""

from __future__ import annotations

import copy
import itertools
import logging
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from d3ray.data.config import DataConfig
from d3ray.data.ledger import BadRecordLedger
from d3ray.data.packing import PackedSequence, SequencePacker
from d3ray.data.shards import Shard, ShardPosition

if TYPE_CHECKING:
    from d3ray.data.pipeline import BlockOut

logger = logging.getLogger(__name__)


class CorpusSource:
    """The corpus as the chunk stream sees it: opens a :class:`CorpusReader` for (epoch, lane, state).

    Plain, picklable: build it on the driver, use it in the coordinator actor. Its all-domain reader can
    serve several domains of a mixed stream (``shares_readers``).

    Args:
        shards: the training shards, in order.
        cfg: the data config.
        tokenizer_dir: the tokenizer directory.
        ledger: the bad-record ledger every reader of this source fills.
    """

    shares_readers = True

    def __init__(self, shards: list[Shard], cfg: DataConfig, tokenizer_dir: str,
                 ledger: BadRecordLedger | None = None) -> None:
        if not shards:
            raise ValueError("no shards to read")
        if not cfg.domains:
            raise ValueError("data.domains=[] is resolved from the corpus first (d3ray.data.corpus.resolve_corpus)")
        self.shards = list(shards)
        self.cfg = cfg
        self.tokenizer_dir = str(tokenizer_dir)
        self.ledger = ledger if ledger is not None else BadRecordLedger()
        self._eos_id: int | None = None

    @property
    def domains(self) -> list[str]:
        return list(self.cfg.domains)

    @property
    def shared_span_blocks(self) -> int:
        """Mixed streams over this source share one reader (``data.mix_shared_span_blocks``)."""
        return self.cfg.mix_shared_span_blocks

    @property
    def eos_id(self) -> int:
        if self._eos_id is None:
            from d3ray.data.tokenizer import load_backend_tokenizer

            self._eos_id = load_backend_tokenizer(self.tokenizer_dir)[1]
        return self._eos_id

    def reader(self, epoch: int, lane: str | None, state: dict[str, Any] | None) -> CorpusReader:
        """A reader of one epoch of ``lane`` (None: all domains), at ``state`` (None: the start)."""
        return CorpusReader(self, epoch, lane, state)

    def with_ledger(self, ledger: BadRecordLedger) -> CorpusSource:
        """This source, its readers counting into ``ledger``."""
        source = copy.copy(self)
        source.ledger = ledger
        return source

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_eos_id": None}


class ReadGroup:
    """Where one group of a reader's sequences starts: the block (or the end-of-epoch flush) they were
    packed from, with the packer's carry before it. Restarting there and dropping the first ``skip``
    sequences re-reads at most that block; :class:`~d3ray.data.domain_lanes.DomainLanes` uses it to
    hand a domain from the shared reader to a lane of its own, and for the shared reader's cursor."""

    __slots__ = ("shard", "shard_name", "position", "carry")

    def __init__(self, shard: int, shard_name: str | None, position: ShardPosition,
                 carry: dict[str, tuple[np.ndarray, str]]) -> None:
        self.shard, self.shard_name, self.position, self.carry = shard, shard_name, position, carry

    def state(self, domain: str | None = None, skip: int = 0) -> dict[str, Any]:
        """A reader state at this group: of the all-domain reader (``domain`` None), or of ``domain``'s
        lane (its carry only), ``skip`` of the group's sequences (of that domain) already taken."""
        carry = self.carry if domain is None else {d: c for d, c in self.carry.items() if d == domain}
        return {"shard": self.shard, "shard_name": self.shard_name, "position": self.position.to_list(),
                "carry": SequencePacker.state_of(carry), "skip": skip}


class CorpusReader:
    """One epoch of one lane: packed sequences from the Ray Data stream, with a resumable state.

    Iterating yields :class:`~d3ray.data.packing.PackedSequence`; after the last shard, the
    partial sequence of each domain (EOS-padded), in ``cfg.domains`` order. :meth:`state` is
    JSON-safe; ``source.reader(epoch, lane, state)`` continues exactly where this one stands.
    """

    def __init__(self, source: CorpusSource, epoch: int, lane: str | None, state: dict[str, Any] | None) -> None:
        self.source, self.epoch, self.lane = source, epoch, lane
        cfg = source.cfg
        self._packer = SequencePacker(cfg.seq_len, source.eos_id)
        n = len(source.shards)
        self._index = {s.name: i for i, s in enumerate(source.shards)}
        self._from_start = state is None
        if state is None:
            shard, position, skip = 0, ShardPosition(), 0
        else:
            shard, position, skip = int(state["shard"]), ShardPosition.from_list(state["position"]), int(state["skip"])
            if shard < n and state.get("shard_name") != source.shards[shard].name:
                raise ValueError(
                    f"data cursor names shard {shard} {state.get('shard_name')!r}, but the corpus lists "
                    f"{source.shards[shard].name!r} there: resume needs the same train_paths"
                )
            self._packer.load_state(state["carry"])
        # The group: the block (or the end-of-epoch flush) whose sequences are being handed out.
        self._group = (shard, position, self._packer.snapshot())
        self._read_group: ReadGroup | None = None
        self._block_positions: np.ndarray | None = None  # (n, 4) positions of the group's documents
        self._block_shards: Sequence[str] = ()  # and their shards
        self._queue: deque[PackedSequence] = deque()
        self._taken = 0
        self._skip = skip
        self._ended = shard >= n
        self._done = False
        # Pre-start the next epoch from the last quarter of the shards on (at least the last one): a
        # stream needs seconds to start, and the rest of an epoch must hide them.
        self._near_end_from = min(n - 1, (3 * n) // 4)
        self.near_end = shard >= self._near_end_from
        self.records_read = 0  # records (good and bad) this reader took from the stream
        self._blocks: Iterator[BlockOut] | None = None
        self._batches: Any = None  # Ray Data's batch iterator under ``_blocks``
        self._thread: threading.Thread | None = None
        self._opened: Iterator[BlockOut] | BaseException | None = None

    @property
    def group(self) -> ReadGroup:
        """The group of the sequence last handed out (before the first: where this reader starts)."""
        if self._read_group is None:
            shard, position, carry = self._group
            n = len(self.source.shards)
            self._read_group = ReadGroup(shard, self.source.shards[shard].name if shard < n else None, position, carry)
        return self._read_group

    # ---- reading -------------------------------------------------------------------------
    def prestart(self) -> None:
        """Start the Ray Data stream in the background (its actors, its first block), now."""
        if self._thread is None and self._blocks is None and not self._ended:
            self._thread = threading.Thread(target=self._open, name=f"prestart-{self.lane}-{self.epoch}", daemon=True)
            self._thread.start()

    def _open(self) -> None:
        from d3ray.data.pipeline import document_dataset, iter_token_blocks

        try:
            source, cfg = self.source, self.source.cfg
            shard, position, _ = self._group
            if self.lane is None:
                cpus, actors, owner = cfg.tokenize_cpus, cfg.tokenize_actors, None
            else:  # all lanes together reserve what one plain stream does
                n = len(cfg.domains)
                cpus, actors, owner = cfg.tokenize_cpus / n, max(1, cfg.tokenize_actors // n), source.domains[0]
            ds = document_dataset(source.shards[shard:], cfg, source.tokenizer_dir, position, self.lane, owner,
                                  cpus, actors)
            self._batches = iter(ds.iter_batches(batch_size=None, batch_format="pyarrow"))
            first = next(self._batches, None)  # waits for the actors and the first block
            # The ledger is filled on the consumer's thread only, as it takes each block.
            rest = itertools.chain([] if first is None else [first], self._batches)
            self._opened = iter_token_blocks(rest, source.ledger, cfg)
        except BaseException as err:  # handed to the consumer by _next_block
            self._opened = err

    def close(self) -> None:
        """Stop the Ray Data stream (its actors) now rather than when the reader is collected."""
        if self._thread is not None:
            self._thread.join()
            opened, self._opened = self._opened, None
            if opened is not None and not isinstance(opened, BaseException):
                self._blocks = opened
        for it in (self._blocks, self._batches):
            if it is not None and hasattr(it, "close"):
                it.close()  # Ray Data shuts its execution (and actors) down when its iterator closes
        self._batches = None
        self._blocks, self._thread, self._done = None, None, True
        self._queue.clear()

    def _next_block(self) -> BlockOut | None:
        if self._blocks is None:
            if self._thread is None:
                self._open()
            else:
                self._thread.join()
            opened, self._opened = self._opened, None
            if isinstance(opened, BaseException):
                raise opened
            assert opened is not None
            self._blocks = opened
        return next(self._blocks, None)

    def __iter__(self) -> CorpusReader:
        return self

    def __next__(self) -> PackedSequence:
        while not self._queue:
            if self._done:
                raise StopIteration
            try:
                self._fill()
            except BaseException:
                self.close()  # stop the Ray Data stream now, not at some later garbage collection
                raise
        self._taken += 1
        return self._queue.popleft()

    def _fill(self) -> None:
        n = len(self.source.shards)
        if self._ended:
            self._group = (n, ShardPosition(), self._packer.snapshot())
            self._read_group = None
            self._block_positions = None
            self._queue.extend(self._packer.flush(self.source.domains))
            self._done = True
            ledger, cfg = self.source.ledger, self.source.cfg
            if self._from_start or ledger.total >= cfg.min_records_before_check:
                ledger.check(cfg.max_bad_fraction)  # not on a few records counted since a resume
            if self.lane is None:
                self.source.ledger.log_summary()
        else:
            before = self._packer.snapshot()
            block = self._next_block()
            if block is None:
                self._ended = True
                return
            shard = self._index[block.shard]
            self.records_read += block.n_records
            self._group = (shard, block.position, before)
            self._read_group = None
            self._block_positions = block.documents.positions
            self._block_shards = block.documents.shards
            self._queue.extend(self._packer.feed_block(block.documents))
            self.near_end = self.near_end or self._index[block.last_shard] >= self._near_end_from
        # Resuming inside a group: drop what the old reader handed out. The new stream may cut its
        # blocks elsewhere; the order of sequences does not depend on that, so the skip simply goes
        # on into the next group when this one makes fewer.
        drop = min(self._skip, len(self._queue))
        for _ in range(drop):
            self._queue.popleft()
        self._taken, self._skip = drop, self._skip - drop

    def state(self) -> dict[str, Any]:
        """JSON-safe position of the next sequence (see the module docstring)."""
        shard, position, carry = self._group
        skip = self._taken + self._skip
        n = len(self.source.shards)
        if shard < n and not self._skip and self._block_positions is not None:
            # Inside a block: restart at the document that completes the next sequence, not at the
            # block's first row, so that a restart reads again one document, not a whole block.
            point = self._packer.restart_point(self._taken, carry)
            if point is not None:
                row, skip, carry = point
                shard = self._index[self._block_shards[row]]
                position = ShardPosition(*(int(v) for v in self._block_positions[row]))
        return {
            "shard": shard,
            "shard_name": self.source.shards[shard].name if shard < n else None,
            "position": position.to_list(),
            "carry": SequencePacker.state_of(carry),
            "skip": skip,
        }



def iter_packed_sequences(
    shards: Sequence[Shard], cfg: DataConfig, tokenizer_dir: str | Path, ledger: BadRecordLedger | None = None
) -> Iterator[PackedSequence]:
    """Stream the corpus once as packed (T,) sequences, deterministically, with stable sample ids.

    Sequences come in stream order (a sequence is emitted when its domain's buffer fills); after
    the last shard each domain's partial sequence follows, in ``cfg.domains`` order. This is one
    epoch of :class:`CorpusSource` (which also resumes and reads per domain).

    Args:
        shards: the shards, in order (see :func:`~d3ray.data.shards.list_shards`).
        cfg: the data config (seq_len, layout, domains, bad-record limit, actor pool size).
        tokenizer_dir: the tokenizer (see :func:`~d3ray.data.tokenizer.ensure_tokenizer`).
        ledger: receives the bad-record counts; pass one to read them afterwards.

    Raises:
        BadRecordFractionError: more than ``cfg.max_bad_fraction`` of the records are bad (checked
            once ``cfg.min_records_before_check`` records are read, and at the end).
    """
    source = CorpusSource(list(shards), cfg, str(tokenizer_dir), ledger if ledger is not None else BadRecordLedger())
    reader = source.reader(epoch=0, lane=None, state=None)
    try:
        yield from reader
    finally:
        reader.close()
