"""Resumable sequence streams over the Ray Data reader: one epoch of one lane, and the lane itself.

A **lane** is one reader over the corpus: all domains (the plain, mixture-less stream) or one
domain (a per-domain stream for the mixers). Each epoch of a lane is a :class:`SequenceReader`:

    Ray Data stream from a position ──► iter_token_blocks (ledger) ──► SequencePacker.feed_block
        ──► sequences of the block, in completion order ──► (the lane's ShuffleBuffer) ──► consumer

**State (the cursor).** A reader's state names the document that completes the next sequence:
its shard and :class:`~d3ray.data.shards.ShardPosition`, the packer's carried tokens just before
that document (< T per domain), and how many of the sequences it completes were already taken
(``SequencePacker.restart_point``). A reader started from that state seeks to the position (no
earlier line is read again; see ``ShardPosition`` for what a compressed shard decompresses again),
restores the packer, packs from there and drops what was taken, so it yields exactly the sequences
the old one would have yielded next; it tokenizes again at most that one document. The :class:`ShuffleBuffer`'s state is its RNG state plus the sequences it holds
(base64 tokens): ``shuffle_buffer`` x T x 4 bytes x 4/3 of JSON.

**Per-domain lanes** (mixing: the domains that the shared all-domain reader of
:class:`~d3ray.data.domain_lanes.DomainLanes` does not serve) each read the whole corpus through their
own Ray Data stream and keep only their domain's records (a byte probe skips the others' lines
without parsing them), so a lane moves through the corpus at its own pace and seeks on its own. Records of no known domain are
counted by the lane of ``cfg.domains[0]``. A lane reads and tokenizes in Ray tasks (no actors of its
own), ``max(1, tokenize_actors // len(domains))`` at once, of ``tokenize_cpus / len(domains)`` CPUs
each: all lanes together reserve what one plain stream's tokenizer tasks do.

**Epoch pre-start.** A Ray Data stream starts its tasks (or tokenizer actors) and reads its first shard before
its first block arrives (seconds). When a reader reaches the last quarter of its shards (at least
the last shard), its lane starts the next epoch's reader in a background thread, so that the epoch
boundary costs no more than any block. The pre-started stream reads ahead until Ray Data's
backpressure stops it; its work is the next epoch's, so nothing is read twice.

The bad-record ledger counts records as they are read: a resumed reader counts from its cursor
(its first block, re-read, is counted again by a ledger restored from a later checkpoint).
"""

from __future__ import annotations

import base64
import itertools
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from d3ray.data.config import DataConfig
from d3ray.data.ledger import BadRecordLedger
from d3ray.data.packing import PackedSequence, SequencePacker, decode_tokens, encode_tokens
from d3ray.data.shards import Shard, ShardPosition

if TYPE_CHECKING:
    from d3ray.data.pipeline import BlockOut

logger = logging.getLogger(__name__)


class CorpusSource:
    """The corpus as the chunk stream sees it: opens a :class:`SequenceReader` for (epoch, lane, state).

    Plain, picklable: build it on the driver, use it in the coordinator actor.

    Args:
        shards: the training shards, in order.
        cfg: the data config.
        tokenizer_dir: the tokenizer directory.
        ledger: the bad-record ledger every reader of this source fills.
    """

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

    def reader(self, epoch: int, lane: str | None, state: dict[str, Any] | None) -> SequenceReader:
        """A reader of one epoch of ``lane`` (None: all domains), at ``state`` (None: the start)."""
        return SequenceReader(self, epoch, lane, state)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_eos_id": None}


class IterableSource:
    """A source over any deterministic per-epoch iterator of sequences (SFT records), with one lane per
    domain (the SFT task): no seeking, a reader's state is the number of sequences it took, and a resumed
    reader reads that many again and drops them (fine for SFT sets; pre-training corpora go through
    :class:`CorpusSource`).

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

    def reader(self, epoch: int, lane: str | None, state: dict[str, Any] | None) -> _IterableReader:
        """A reader of one epoch of ``lane`` (a task; None: all of them), at ``state`` (None: the start)."""
        if lane is None:
            return _IterableReader(iter(self.sequences_for(epoch, None, self.ledger)), _taken(state))
        if lane not in self.domains:
            raise ValueError(f"no lane for domain {lane!r}: the SFT training files have tasks {self.domains}")
        ledger = _LaneLedger(self.ledger, self._read_upto, epoch)
        sequences = (seq for seq in self.sequences_for(epoch, lane, ledger) if seq.domain == lane)
        return _IterableReader(sequences, _taken(state))


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


class _IterableReader:
    def __init__(self, sequences: Iterator[PackedSequence], skip: int) -> None:
        self._sequences = sequences
        self.taken = 0
        self.near_end = False
        for _ in range(skip):
            next(self._sequences)
            self.taken += 1

    def prestart(self) -> None:
        return None

    def close(self) -> None:
        return None

    def __iter__(self) -> _IterableReader:
        return self

    def __next__(self) -> PackedSequence:
        seq = next(self._sequences)
        self.taken += 1
        return seq

    def state(self) -> dict[str, Any]:
        return {"taken": self.taken}


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


class SequenceReader:
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

    def __iter__(self) -> SequenceReader:
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
    mask = getattr(seq, "loss_mask", None)
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


class Lane:
    """One lane across epochs: a reader per epoch, a seeded shuffle per epoch, and the pre-start.

    Args:
        source: opens the readers (a :class:`CorpusSource`, or any object with the same ``reader``).
        lane: the domain of a per-domain lane, None for all domains.
        shuffle_buffer: sequences in the shuffle buffer (0 = stream order).
        seed_key: the shuffle of epoch e is seeded with ``[*seed_key, e]``.
        state: a :meth:`state` to resume from (None: epoch 0 from the start).
    """

    def __init__(self, source: Any, lane: str | None, shuffle_buffer: int, seed_key: list[int],
                 state: dict[str, Any] | None = None) -> None:
        self.source, self.lane = source, lane
        self.shuffle_buffer, self.seed_key = shuffle_buffer, list(seed_key)
        self.epoch = int(state["epoch"]) if state else 0
        self._reader = source.reader(self.epoch, lane, state["reader"] if state else None)
        self._shuffle = ShuffleBuffer(shuffle_buffer, [*self.seed_key, self.epoch], state["shuffle"] if state else None)
        self._reader_done = False
        self._next_reader: Any = None
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
        self.records_read[self.epoch] = getattr(self._reader, "records_read", 0)
        self.epoch += 1
        self._reader = self._next_reader or self.source.reader(self.epoch, self.lane, None)
        self._next_reader = None
        self._shuffle = ShuffleBuffer(self.shuffle_buffer, [*self.seed_key, self.epoch])
        self._reader_done = False
        return None

    def prestart(self) -> None:
        """Start the current reader's Ray Data stream in the background (lanes start in parallel)."""
        if hasattr(self._reader, "prestart"):
            self._reader.prestart()

    def close(self) -> None:
        """Stop this lane's streams (the current and the pre-started one)."""
        for reader in (self._reader, self._next_reader):
            if reader is not None and hasattr(reader, "close"):
                reader.close()
        self._next_reader = None

    def state(self) -> dict[str, Any]:
        """JSON-safe state: ``{"epoch", "reader": SequenceReader.state(), "shuffle": ...}``."""
        return {"epoch": self.epoch, "reader": self._reader.state(), "shuffle": self._shuffle.state()}


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
