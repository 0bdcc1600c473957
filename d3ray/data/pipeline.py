"""The training-data stream on Ray Data: read + tokenize tasks (or an actor pool) → pack per domain.

    shard descriptors (from_items, one block per shard; the first may start at a ShardPosition)
      │  map_batches(read_and_tokenize, TaskPoolStrategy(cfg.tokenize_actors)): one task per shard
      │  reads and tokenizes, ``tokenize_actors`` shards at once; with fewer shards than that,
      │  map_batches(read_shard_blocks) tasks feed an ActorPoolStrategy(1..tokenize_actors) of
      │  TokenizeBatch. Each line becomes a good or a bad row (a bad line costs only itself);
      │  a per-domain lane keeps only its domain's rows
      ▼  rows: token_ids (list<int32>), domain, shard, line, positions, bad_reason, detail
    iter_token_blocks (consumer: e.g. the schedule coordinator actor)
      │  BadRecordLedger: count/log bad rows per block, stop above max_bad_fraction
      ▼  TokenBlock (good documents, columnar) + the position of the block's first row
    SequencePacker.feed_block (d3ray.data.corpus_source) → per-domain (T,) sequences with stable ids

One task per shard reads and tokenizes (:func:`read_and_tokenize`, its tokenizer cached per Ray worker
process), ``tokenize_actors`` shards at once: a task runs in one of Ray's pooled worker processes where
an actor starts a process of its own (seconds of imports), and no text crosses the object store. On 8
copies of the shared train shard, in a warm Ray instance, the first block came after 1.5-1.7 s
instead of 3.9-4.2 s with one tokenizer actor, and the whole read ran at 668-710k tok/s instead of
646-660k; with two, the first chunk came after 2.1-2.9 s instead of 6.5-7.0 s, at the same tok/s,
and a mixed stream's first chunk after 4.0-4.2 s instead of 9.5-10.9 s. Only a corpus with fewer
shards than ``tokenize_actors`` (one large shard) uses the actor pool: reading runs in small tasks
(up to ``tokenize_actors + 1`` shards at once) and the actors share out the blocks of a single shard
(the text of a block crosses the object store once, in shared memory).
Ray Data's built-in ``read_json`` fails a whole read task (or drops a whole file with
``max_errored_blocks``) on one malformed line and loads a file whole per task (ray#46485), hence
our own generator over :func:`~d3ray.data.records.iter_documents`. Parquet and Arrow shards go
through the same task, read with pyarrow (:mod:`d3ray.data.columnar`, the reader under Ray Data's
own ``read_parquet``): ``read_parquet`` would give rows without a shard position, so no seeking resume,
no per-domain lanes and no per-row bad-record accounting; here a parquet shard is one more shard.
``preserve_order`` makes the stream order (shards as listed, lines in file order) independent of
the number of actors, so the same corpus always yields the same sequences with the same ids. Blocks are small
(``cfg.block_bytes``) so tokens stream to the consumer while a shard is still being read. Every
row carries its shard position, so a stream can be started again at any row
(:func:`document_dataset` ``start=``) without reading what comes before it.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from d3ray.data.config import DEFAULT_DOMAIN_KEY, DEFAULT_TEXT_KEY, DataConfig
from d3ray.data.ledger import BadRecordLedger
from d3ray.data.packing import TokenBlock
from d3ray.data.records import Document, iter_documents
from d3ray.data.shards import Shard, ShardPosition

if TYPE_CHECKING:
    import ray.data

logger = logging.getLogger(__name__)

#: CPUs of a read task feeding the tokenizer actors: it mostly waits for its consumer (differs from the
#: actors' CPUs, so Ray Data does not fuse the two).
READ_TASK_CPUS = 0.25


def stream_cpus(cfg: DataConfig) -> float:
    """The most CPUs one stream reserves at once (what a Tune trial counts for its data): ``tokenize_actors``
    read-and-tokenize tasks (or tokenizer actors) of ``tokenize_cpus`` each, plus, in the actor-pool mode,
    up to ``tokenize_actors + 1`` read tasks of ``READ_TASK_CPUS``."""
    actors = max(1, cfg.tokenize_actors)
    return actors * cfg.tokenize_cpus + (actors + 1) * READ_TASK_CPUS
_POSITION_COLUMNS = ("line", "offset", "frame_offset", "frame_start")
_PASSED_COLUMNS = ("domain", "shard", *_POSITION_COLUMNS, "bad_reason", "detail")

DOCUMENT_SCHEMA = pa.schema(
    [
        ("text", pa.large_string()),
        ("domain", pa.string()),
        ("shard", pa.string()),
        ("line", pa.int64()),
        ("offset", pa.int64()),
        ("frame_offset", pa.int64()),
        ("frame_start", pa.int64()),
        ("bad_reason", pa.string()),
        ("detail", pa.string()),
    ]
)


def _documents_table(docs: list[Document]) -> pa.Table:
    return pa.table(
        {
            "text": [d.text for d in docs],
            "domain": [d.domain for d in docs],
            "shard": [d.shard for d in docs],
            "line": [d.line for d in docs],
            "offset": [d.offset for d in docs],
            "frame_offset": [d.frame_offset for d in docs],
            "frame_start": [d.frame_start for d in docs],
            "bad_reason": [d.bad_reason for d in docs],
            "detail": [d.detail for d in docs],
        },
        schema=DOCUMENT_SCHEMA,
    )


def read_shard_blocks(
    batch: dict[str, np.ndarray],
    layout: str,
    domains: list[str],
    max_record_bytes: int,
    rows_per_block: int,
    block_bytes: int,
    lane: str | None = None,
    unattributed_lane: str | None = None,
    text_key: str = DEFAULT_TEXT_KEY,
    domain_key: str = DEFAULT_DOMAIN_KEY,
) -> Iterator[pa.Table]:
    """Ray Data UDF: stream the shards described in ``batch`` (each from its start position) as
    blocks of document rows (``rows_per_block`` rows, or fewer once their text passes ``block_bytes``)."""
    for i, (uri, name, folder, domain) in enumerate(zip(batch["uri"], batch["name"], batch["folder"],
                                                        batch["domain"], strict=True)):
        shard = Shard(uri=str(uri), name=str(name), folder=str(folder), domain=str(domain))
        start = ShardPosition(*(int(batch[f"start_{c}"][i]) for c in _POSITION_COLUMNS))
        docs: list[Document] = []
        text_bytes = 0
        for doc in iter_documents(shard, layout, domains, max_record_bytes, start, lane, unattributed_lane,
                                  text_key=text_key, domain_key=domain_key):
            docs.append(doc)
            text_bytes += len(doc.text)
            if len(docs) >= rows_per_block or text_bytes >= block_bytes:
                yield _documents_table(docs)
                docs, text_bytes = [], 0
        if docs:
            yield _documents_table(docs)


class TokenizeBatch:
    """Ray Data callable class: tokenizes the good rows of a block, bad rows pass with no tokens."""

    def __init__(self, tokenizer_dir: str) -> None:
        from d3ray.data.tokenizer import load_backend_tokenizer

        self.backend, _ = load_backend_tokenizer(tokenizer_dir)

    def __call__(self, batch: pa.Table) -> pa.Table:
        bad = batch.column("bad_reason").to_pylist()
        texts = batch.column("text").to_pylist()
        good = [i for i, reason in enumerate(bad) if not reason]
        encodings = self.backend.encode_batch_fast([texts[i] for i in good], add_special_tokens=False)
        # Columnar: one int32 buffer and offsets (a bad row is an empty list), not a list of Python lists
        # that Arrow would check int by int (3x slower on the shared shard).
        arrays = [np.asarray(enc.ids, dtype=np.int32) for enc in encodings]
        lengths = np.zeros(len(bad), dtype=np.int64)
        lengths[good] = [len(a) for a in arrays]
        offsets = np.zeros(len(bad) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        values = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int32)
        out = {"token_ids": pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values))}
        out.update({c: batch.column(c) for c in _PASSED_COLUMNS})
        return pa.table(out)


_TOKENIZERS: dict[str, TokenizeBatch] = {}  # per Ray worker process, shared by the lanes' tasks


def read_and_tokenize(batch: dict[str, np.ndarray], tokenizer_dir: str, **read_kwargs: object) -> Iterator[pa.Table]:
    """Ray Data UDF: :func:`read_shard_blocks` then :class:`TokenizeBatch` in one task, with the
    tokenizer loaded once per worker process (a task, unlike an actor, starts no process)."""
    tokenize = _TOKENIZERS.get(tokenizer_dir)
    if tokenize is None:
        tokenize = _TOKENIZERS[tokenizer_dir] = TokenizeBatch(tokenizer_dir)
    for block in read_shard_blocks(batch, **read_kwargs):  # type: ignore[arg-type]
        yield tokenize(block)


def lane_rows_per_block(cfg: DataConfig) -> int:
    """Rows per output block of one domain lane: ``tokenize_batch_size / len(domains)``.

    A mixed stream runs one lane per domain, and all of them share the tokenizer CPUs, so with the
    plain stream's block size the first chunk waits until every lane has tokenized a whole block
    (about ``len(domains)`` plain blocks of work). Smaller lane blocks make the lanes together
    produce about one plain block per round: on 4 shards of the shared sample the mixed stream's
    first chunk came after 12.4 s instead of 20.2 s, and the whole read took 26.5 s instead of
    34.8 s (the plain stream: 24.9 s).
    """
    return max(1, cfg.tokenize_batch_size // max(1, len(cfg.domains)))


def document_dataset(
    shards: Sequence[Shard],
    cfg: DataConfig,
    tokenizer_dir: str | Path,
    start: ShardPosition | None = None,
    lane: str | None = None,
    unattributed_lane: str | None = None,
    tokenize_cpus: float | None = None,
    tokenize_actors: int | None = None,
) -> ray.data.Dataset:
    """A lazy, order-preserving Ray Dataset of tokenized documents, one row per record.

    Columns: ``token_ids`` (variable-length int32; empty for a bad record), ``domain``,
    ``shard`` (stable shard name), ``line`` (1-based), ``offset`` / ``frame_offset`` /
    ``frame_start`` (the record's :class:`~d3ray.data.shards.ShardPosition`), ``bad_reason``
    (``""`` when good), ``detail``. Requires a running Ray (``ray.init`` or inside a Ray task/actor).

    Args:
        shards: the shards to read, in order.
        cfg: the data config.
        tokenizer_dir: the tokenizer.
        start: where to start in the first shard (default: its first line).
        lane, unattributed_lane: keep only one domain's records (see :func:`iter_documents`).
        tokenize_cpus: CPUs per read-and-tokenize task, or per tokenizer actor (default
            ``cfg.tokenize_cpus``).
        tokenize_actors: shards read and tokenized at once (one task each), or, with fewer shards
            than this (and not in a lane), the tokenizer actors (default ``cfg.tokenize_actors``).
    """
    import ray.data

    if not shards:
        raise ValueError("no shards to read")
    actors = cfg.tokenize_actors if tokenize_actors is None else tokenize_actors
    start = start or ShardPosition()
    items = []
    for i, shard in enumerate(shards):
        at = start if i == 0 else ShardPosition()
        items.append({**shard.to_dict(), **{f"start_{c}": getattr(at, c) for c in _POSITION_COLUMNS}})
    ds = ray.data.from_items(items, override_num_blocks=len(shards))
    ds.context.execution_options.preserve_order = True  # this dataset's own context, not the global one
    ds.context.target_max_block_size = cfg.block_bytes
    read_kwargs = {
        "layout": cfg.layout,
        "domains": list(cfg.domains),
        "max_record_bytes": cfg.max_record_bytes,
        "rows_per_block": cfg.tokenize_batch_size if lane is None else lane_rows_per_block(cfg),
        "block_bytes": cfg.block_bytes,
        "lane": lane,
        "unattributed_lane": unattributed_lane,
        "text_key": cfg.text_key,
        "domain_key": cfg.domain_key,
    }
    cpus = cfg.tokenize_cpus if tokenize_cpus is None else tokenize_cpus
    if lane is not None or len(shards) >= actors:  # a read-and-tokenize task per shard, ``actors`` at once
        return ds.map_batches(
            read_and_tokenize,
            batch_size=1,
            batch_format="numpy",
            compute=ray.data.TaskPoolStrategy(size=min(len(shards), actors)),
            num_cpus=cpus,
            fn_kwargs={"tokenizer_dir": str(tokenizer_dir), **read_kwargs},
        )
    ds = ds.map_batches(
        read_shard_blocks,
        batch_size=1,
        batch_format="numpy",
        # Reads run as their own small tasks, not fused into the tokenizer actors: parsing a shard
        # (about 7% of its tokenizing time) then overlaps with tokenizing the one before.
        compute=ray.data.TaskPoolStrategy(size=min(len(shards), actors + 1)),
        num_cpus=READ_TASK_CPUS,
        fn_kwargs=read_kwargs,
    )
    return ds.map_batches(
        TokenizeBatch,
        fn_constructor_kwargs={"tokenizer_dir": str(tokenizer_dir)},
        batch_size=cfg.tokenize_batch_size,
        batch_format="pyarrow",
        # At least one actor is enough to start: a stream pre-started while the previous epoch's
        # still holds its actors' CPUs starts with what is free and grows as they are released.
        compute=ray.data.ActorPoolStrategy(min_size=1, max_size=actors, initial_size=actors),
        num_cpus=cpus,
    )


@dataclass(frozen=True)
class BlockOut:
    """One stream block at the consumer: its good documents and where its first row is."""

    documents: TokenBlock
    shard: str
    """Name of the shard of the block's first row (a block may span shards: Ray Data bundles them)."""
    last_shard: str
    """Name of the shard of the block's last row."""
    position: ShardPosition
    """Position of the block's first row (good or bad): a stream restarted there re-reads this block."""
    n_records: int
    """Records (good and bad rows) in the block."""


def iter_token_blocks(
    batches: Iterator[pa.Table], ledger: BadRecordLedger, cfg: DataConfig
) -> Iterator[BlockOut]:
    """Good documents of each tokenized block, columnar; bad rows go to ``ledger``, which is checked
    as it fills. Per block, not per document: the only Python loops run over bad rows and shards."""
    checked_at = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        first = {c: batch.column(c)[0].as_py() for c in ("shard", *_POSITION_COLUMNS)}
        n_records = batch.num_rows
        last_shard = batch.column("shard")[n_records - 1].as_py()
        bad_mask = pc.not_equal(batch.column("bad_reason"), "")
        n_bad = pc.sum(bad_mask).as_py() or 0
        if n_bad:
            bad = batch.filter(bad_mask)
            for shard, line, reason, detail in zip(*(bad.column(c).to_pylist() for c in
                                                     ("shard", "line", "bad_reason", "detail")), strict=True):
                ledger.record_bad(shard, line, reason, detail)
            batch = batch.filter(pc.invert(bad_mask))
        for shard, count in Counter(batch.column("shard").to_pylist()).items():
            ledger.record_good(shard, count)
        ids = batch.column("token_ids").combine_chunks()
        yield BlockOut(
            TokenBlock(
                values=ids.values.to_numpy(zero_copy_only=False),
                offsets=ids.offsets.to_numpy(),
                domains=batch.column("domain").to_pylist(),
                shards=batch.column("shard").to_pylist(),
                lines=batch.column("line").to_numpy(),
                positions=np.stack([batch.column(c).to_numpy() for c in _POSITION_COLUMNS], axis=1),
            ),
            first["shard"],
            last_shard,
            ShardPosition(*(first[c] for c in _POSITION_COLUMNS)),
            n_records,
        )
        if ledger.total >= cfg.min_records_before_check and ledger.total > checked_at:
            ledger.check(cfg.max_bad_fraction)
            checked_at = ledger.total
