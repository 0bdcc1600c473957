"""Fixed evaluation sets: per-domain held-out sequences, and sequences of a raw text file.

Evaluation sets are small (``max_sequences_per_domain`` x T tokens), needed whole by every
evaluating worker and must be identical on every call, so they are read in-process (no Ray)
with the same reader, tokenizer and packer as training, and stop reading as soon as every
domain is full. Only full T-token sequences are kept: EOS padding would bias the loss.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from pathlib import Path

import fsspec
import numpy as np

from d3ray.data.config import DataConfig
from d3ray.data.ledger import BadRecordLedger
from d3ray.data.packing import SequencePacker, TokenizedDocument
from d3ray.data.records import Document, iter_documents
from d3ray.data.shards import Shard, list_shards
from d3ray.data.tokenizer import encode_texts, load_backend_tokenizer

logger = logging.getLogger(__name__)


def _document_batches(
    paths: Sequence[str | Shard], cfg: DataConfig, ledger: BadRecordLedger
) -> Iterator[list[Document]]:
    batch: list[Document] = []
    shards = [p for p in paths if isinstance(p, Shard)] or list_shards([str(p) for p in paths])
    for shard in shards:
        for doc in iter_documents(shard, cfg.layout, cfg.domains, cfg.max_record_bytes, text_key=cfg.text_key,
                                  domain_key=cfg.domain_key):
            ledger.record(doc)
            if not doc.is_bad:
                batch.append(doc)
            if len(batch) >= cfg.tokenize_batch_size:
                yield batch
                batch = []
    if batch:
        yield batch


def load_eval_sequences(
    paths: str | Sequence[str] | Sequence[Shard],
    cfg: DataConfig,
    tokenizer_dir: str | Path,
    max_sequences_per_domain: int,
    ledger: BadRecordLedger | None = None,
) -> dict[str, np.ndarray]:
    """Held-out sequences per domain, packed exactly as training data is.

    Args:
        paths: held-out shards (folders, globs, URIs), or the listed shards themselves (as
            :func:`d3ray.data.corpus.prepare_corpus` resolves them: their domains in layout ``path``).
        cfg: the data config (seq_len, layout, domains).
        tokenizer_dir: the run's tokenizer.
        max_sequences_per_domain: keep at most this many (the first ones) per domain.
        ledger: receives bad-record counts; the bad fraction is checked at the end.

    Returns:
        ``{domain: tokens (n_domain, T) int32}`` in ``cfg.domains`` order, for each domain with at
        least one full sequence.
    """
    if max_sequences_per_domain < 1:
        raise ValueError(f"max_sequences_per_domain must be >= 1, got {max_sequences_per_domain}")
    paths = [paths] if isinstance(paths, str) else list(paths)
    ledger = ledger if ledger is not None else BadRecordLedger()
    backend, eos_id = load_backend_tokenizer(tokenizer_dir)
    packer = SequencePacker(cfg.seq_len, eos_id)
    kept: dict[str, list[np.ndarray]] = {d: [] for d in cfg.domains}
    for docs in _document_batches(paths, cfg, ledger):
        ids = encode_texts(backend, [d.text for d in docs])
        for doc, tokens in zip(docs, ids, strict=True):
            if len(kept[doc.domain]) >= max_sequences_per_domain:
                continue
            for seq in packer.feed(TokenizedDocument(tokens, doc.domain, doc.shard, doc.line)):
                if len(kept[seq.domain]) < max_sequences_per_domain:
                    kept[seq.domain].append(seq.tokens)
        if all(len(v) >= max_sequences_per_domain for v in kept.values()):
            break
    ledger.check(cfg.max_bad_fraction)
    empty = [d for d, v in kept.items() if not v]
    if empty:
        logger.warning("no full %d-token evaluation sequence for domains %s in %s", cfg.seq_len, empty,
                       [p.name if isinstance(p, Shard) else p for p in paths][:8])
    out = {d: np.stack(v) for d, v in kept.items() if v}
    logger.info("evaluation sequences per domain: %s", {d: len(v) for d, v in out.items()})
    return out


def load_text_file_sequences(
    path: str, tokenizer_dir: str | Path, seq_len: int, max_sequences: int, lines_per_batch: int = 512
) -> np.ndarray:
    """Consecutive T-token windows of a raw text file (e.g. WikiText-2 ``wiki.test.raw``).

    The file is one document: it is read and tokenized in blocks of lines (local path or URI), the
    tokens concatenated without EOS and cut into non-overlapping windows; the partial tail is dropped.

    Returns:
        tokens: (n, T) int32, ``n <= max_sequences``.

    Raises:
        ValueError: the file holds fewer than T tokens.
    """
    if seq_len < 2 or max_sequences < 1:
        raise ValueError(f"need seq_len >= 2 and max_sequences >= 1, got {seq_len}, {max_sequences}")
    backend, _ = load_backend_tokenizer(tokenizer_dir)
    wanted = seq_len * max_sequences
    pieces: list[np.ndarray] = []
    n_tokens = 0
    with fsspec.open(path, "rt", encoding="utf-8") as fh:
        lines: list[str] = []
        for line in fh:
            lines.append(line)
            if len(lines) >= lines_per_batch:
                (ids,) = encode_texts(backend, ["".join(lines)])
                pieces.append(ids)
                n_tokens += len(ids)
                lines = []
                if n_tokens >= wanted:
                    break
        if lines and n_tokens < wanted:
            (ids,) = encode_texts(backend, ["".join(lines)])
            pieces.append(ids)
            n_tokens += len(ids)
    n = min(n_tokens // seq_len, max_sequences)
    if n == 0:
        raise ValueError(f"{path}: {n_tokens} tokens, fewer than one sequence of {seq_len}")
    return np.concatenate(pieces)[: n * seq_len].reshape(n, seq_len)
