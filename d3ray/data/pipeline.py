"""The training-data stream on Ray Data: read shards → tokenize (actor pool) → pack per domain.

    shard descriptors (from_items, one block per shard)
      │  map_batches(read_shard_blocks)   streams one shard's lines; each line becomes a good or
      │                                   a bad row (a bad line costs only itself)
      ▼  rows: text, domain, shard, line, bad_reason, detail
      │  map_batches(TokenizeBatch, ActorPoolStrategy(size=cfg.tokenize_actors))
      ▼  rows: token_ids (list<int32>), domain, shard, line, bad_reason, detail
    iter_packed_sequences (consumer: e.g. the schedule coordinator actor)
      │  BadRecordLedger: count/log bad rows, stop above max_bad_fraction
      ▼  SequencePacker: per-domain (T,) sequences with stable sample ids

Ray fuses the read into the tokenizer actors (no text crosses the object store), so up to
``tokenize_actors`` shards are read and tokenized at once; a corpus of one shard uses one actor.
Ray Data's built-in ``read_json`` fails a whole read task (or drops a whole file with
``max_errored_blocks``) on one malformed line and loads a file whole per task (ray#46485), hence
our own generator over :func:`~d3ray.data.records.iter_documents`. ``preserve_order`` makes the
stream order (shards as listed, lines in file order) independent of the number of actors, so the
same corpus always yields the same sequences with the same ids. Blocks are small
(``cfg.block_bytes``) so tokens stream to the consumer while a shard is still being read.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from d3ray.data.config import DataConfig
from d3ray.data.packing import PackedSequence, SequencePacker, TokenizedDocument
from d3ray.data.records import BadRecordLedger, Document, iter_documents
from d3ray.data.shards import Shard

if TYPE_CHECKING:
    import ray.data

logger = logging.getLogger(__name__)

DOCUMENT_SCHEMA = pa.schema(
    [
        ("text", pa.large_string()),
        ("domain", pa.string()),
        ("shard", pa.string()),
        ("line", pa.int64()),
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
) -> Iterator[pa.Table]:
    """Ray Data UDF: stream the shards described in ``batch`` as blocks of document rows
    (``rows_per_block`` rows, or fewer once their text passes ``block_bytes``)."""
    for uri, name, folder in zip(batch["uri"], batch["name"], batch["folder"], strict=True):
        shard = Shard(uri=str(uri), name=str(name), folder=str(folder))
        docs: list[Document] = []
        text_bytes = 0
        for doc in iter_documents(shard, layout, domains, max_record_bytes):
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
        lengths = np.zeros(len(bad), dtype=np.int64)
        pieces = []
        for i, enc in zip(good, encodings, strict=True):
            ids = np.asarray(enc.ids, dtype=np.int32)
            lengths[i] = len(ids)
            pieces.append(ids)
        offsets = np.zeros(len(bad) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        values = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int32)
        token_ids = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values, type=pa.int32()))
        return pa.table(
            {
                "token_ids": token_ids,
                "domain": batch.column("domain"),
                "shard": batch.column("shard"),
                "line": batch.column("line"),
                "bad_reason": batch.column("bad_reason"),
                "detail": batch.column("detail"),
            }
        )


def document_dataset(shards: Sequence[Shard], cfg: DataConfig, tokenizer_dir: str | Path) -> ray.data.Dataset:
    """A lazy, order-preserving Ray Dataset of tokenized documents, one row per record.

    Columns: ``token_ids`` (variable-length int32; empty for a bad record), ``domain``,
    ``shard`` (stable shard name), ``line`` (1-based), ``bad_reason`` (``""`` when good), ``detail``.
    Requires a running Ray (``ray.init`` or inside a Ray task/actor).
    """
    import ray.data

    if not shards:
        raise ValueError("no shards to read")
    ds = ray.data.from_items([s.to_dict() for s in shards], override_num_blocks=len(shards))
    ds.context.execution_options.preserve_order = True  # this dataset's own context, not the global one
    ds.context.target_max_block_size = cfg.block_bytes
    ds = ds.map_batches(
        read_shard_blocks,
        batch_size=1,
        batch_format="numpy",
        fn_kwargs={
            "layout": cfg.layout,
            "domains": list(cfg.domains),
            "max_record_bytes": cfg.max_record_bytes,
            "rows_per_block": cfg.tokenize_batch_size,
            "block_bytes": cfg.block_bytes,
        },
    )
    return ds.map_batches(
        TokenizeBatch,
        fn_constructor_kwargs={"tokenizer_dir": str(tokenizer_dir)},
        batch_size=cfg.tokenize_batch_size,
        batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(size=cfg.tokenize_actors),
        num_cpus=cfg.tokenize_cpus,
    )


def iter_tokenized_documents(
    batches: Iterator[pa.Table], ledger: BadRecordLedger, cfg: DataConfig
) -> Iterator[TokenizedDocument]:
    """Good documents out of tokenized blocks; bad rows go to ``ledger``, which is checked as it fills."""
    checked_at = 0
    for batch in batches:
        ids = batch.column("token_ids").combine_chunks()
        offsets = ids.offsets.to_numpy()
        values = ids.values.to_numpy()
        cols: dict[str, list[Any]] = {
            c: batch.column(c).to_pylist() for c in ("domain", "shard", "line", "bad_reason")
        }
        details = batch.column("detail").to_pylist()
        for i, reason in enumerate(cols["bad_reason"]):
            if reason:
                ledger.record_bad(cols["shard"][i], cols["line"][i], reason, details[i])
                continue
            ledger.record_good(cols["shard"][i])
            yield TokenizedDocument(
                values[offsets[i] : offsets[i + 1]], cols["domain"][i], cols["shard"][i], cols["line"][i]
            )
        if ledger.total >= cfg.min_records_before_check and ledger.total > checked_at:
            ledger.check(cfg.max_bad_fraction)
            checked_at = ledger.total
    ledger.check(cfg.max_bad_fraction)


def iter_packed_sequences(
    shards: Sequence[Shard], cfg: DataConfig, tokenizer_dir: str | Path, ledger: BadRecordLedger | None = None
) -> Iterator[PackedSequence]:
    """Stream the corpus as packed (T,) sequences, deterministically, with stable sample ids.

    Sequences come in stream order (a sequence is emitted when its domain's buffer fills); after
    the last shard each domain's partial sequence follows, in ``cfg.domains`` order.

    Args:
        shards: the shards, in order (see :func:`~d3ray.data.shards.list_shards`).
        cfg: the data config (seq_len, layout, domains, bad-record limit, actor pool size).
        tokenizer_dir: the tokenizer (see :func:`~d3ray.data.tokenizer.ensure_tokenizer`).
        ledger: receives the bad-record counts; pass one to read them afterwards.

    Raises:
        BadRecordFractionError: more than ``cfg.max_bad_fraction`` of the records are bad (checked
            once ``cfg.min_records_before_check`` records are read, and at the end).
    """
    from d3ray.data.tokenizer import load_backend_tokenizer

    ledger = ledger if ledger is not None else BadRecordLedger()
    _, eos_id = load_backend_tokenizer(tokenizer_dir)
    packer = SequencePacker(cfg.seq_len, eos_id)
    ds = document_dataset(shards, cfg, tokenizer_dir)
    batches = ds.iter_batches(batch_size=None, batch_format="pyarrow")
    for doc in iter_tokenized_documents(batches, ledger, cfg):
        yield from packer.feed(doc)
    yield from packer.flush(cfg.domains)
    ledger.log_summary()
