"""Unigram baselines of the validation text under a run's tokenizer: what "far below unigram" means.

A model that ignores context cannot beat a unigram model, so a final eval loss near the unigram
cross-entropy means the model has learnt little beyond token frequencies, and no data order can
show anything there. Both figures are in nats per token (the unit of the eval loss) and are
computed on exactly the tokens the run evaluates (the per-domain validation sequences, packed as
training data):

- **cross-entropy** ``−mean ln p(token)`` under the unigram model fitted on the run's *training*
  text (add-½ smoothing over the vocabulary): the loss a context-free model trained on the same
  data gets. Per domain, and ``mean`` over domains (compare with ``eval/mean_loss``, also a mean
  over domains).
- **entropy** ``−Σ p ln p`` of the validation tokens' own frequencies (plug-in): a floor no unigram
  model reaches on this text (it knows the answer's frequencies; biased low by ≈ (V − 1) / 2N nats,
  Miller 1955). Per domain (a unigram model that also knows the domain), ``mean`` and ``pooled``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np


def unigram_entropy(tokens: np.ndarray) -> float:
    """Plug-in entropy (nats) of the token-id distribution of ``tokens`` (any shape)."""
    counts = np.bincount(np.asarray(tokens, dtype=np.int64).ravel())
    counts = counts[counts > 0].astype(np.float64)
    if counts.size == 0:
        return float("nan")
    p = counts / counts.sum()
    return float(-(p * np.log(p)).sum())


def unigram_cross_entropy(train_counts: np.ndarray, tokens: np.ndarray, smoothing: float = 0.5) -> float:
    """Mean −ln p(t) over ``tokens`` under the unigram model ``(counts + α) / (Σ counts + α·V)``.

    Args:
        train_counts: (V,) token counts of the training text (V = the vocabulary size).
        tokens: token ids (any shape), each < V.
        smoothing: α, added to every count (so unseen tokens have a finite cost).
    """
    counts = np.asarray(train_counts, dtype=np.float64) + smoothing
    log_p = np.log(counts) - np.log(counts.sum())
    return float(-log_p[np.asarray(tokens, dtype=np.int64).ravel()].mean())


def eval_set_figures(eval_sets: Mapping[str, np.ndarray], train_counts: np.ndarray | None = None) -> dict[str, float]:
    """``entropy/<domain>``, ``entropy/mean``, ``entropy/pooled`` and, with ``train_counts``,
    ``cross_entropy/<domain>``, ``cross_entropy/mean`` of per-domain (n, T) token arrays."""
    out: dict[str, float] = {}
    if not eval_sets:
        return out
    entropies = {name: unigram_entropy(t) for name, t in eval_sets.items()}
    out.update({f"entropy/{name}": h for name, h in entropies.items()})
    out["entropy/mean"] = float(np.mean(list(entropies.values())))
    out["entropy/pooled"] = unigram_entropy(np.concatenate([np.asarray(t).ravel() for t in eval_sets.values()]))
    if train_counts is not None:
        cross = {name: unigram_cross_entropy(train_counts, t) for name, t in eval_sets.items()}
        out.update({f"cross_entropy/{name}": h for name, h in cross.items()})
        out["cross_entropy/mean"] = float(np.mean(list(cross.values())))
    return out


def token_counts(paths: list[str], data: Any, tokenizer_dir: str | Path, vocab_size: int,
                 max_docs: int | None = None) -> np.ndarray:
    """(V,) token counts of the documents under ``paths`` (``data``: the run's DataConfig)."""
    from d3ray.data.records import iter_documents
    from d3ray.data.shards import list_shards
    from d3ray.data.tokenizer import encode_texts, load_backend_tokenizer

    backend, _ = load_backend_tokenizer(tokenizer_dir)
    counts = np.zeros(vocab_size, dtype=np.int64)
    texts: list[str] = []
    seen = 0

    def flush() -> None:
        for ids in encode_texts(backend, texts):
            counts[:] += np.bincount(ids, minlength=vocab_size)[:vocab_size]
        texts.clear()

    for shard in list_shards(paths):
        for doc in iter_documents(shard, data.layout, data.domains, data.max_record_bytes, text_key=data.text_key,
                                  domain_key=data.domain_key):
            if doc.is_bad:
                continue
            texts.append(doc.text)
            seen += 1
            if len(texts) >= 256:
                flush()
            if max_docs is not None and seen >= max_docs:
                flush()
                return counts
    flush()
    return counts


def validation_sources(cfg: Any) -> tuple[list[str], list[str], Path] | None:
    """(train paths, validation paths, tokenizer dir) of a pre-training run's unigram figures, or None
    where it has none: a fine-tuning run, no validation data, no tokenizer. A run on the generated corpus
    reads ``<run_dir>/sample_data/``; the tokenizer is ``data.tokenizer.path`` or ``<run_dir>/tokenizer``."""
    from d3ray.data.tokenizer import TOKENIZER_SUBDIR

    if cfg.sft is not None:
        return None
    train, validation = list(cfg.data.train_paths), list(cfg.data.validation_paths)
    if not train:  # the generated sample corpus, if the run wrote one
        if not (cfg.run_dir / "sample_data" / "train").is_dir():
            return None
        train = [str(cfg.run_dir / "sample_data" / "train")]
        validation = validation or [str(cfg.run_dir / "sample_data" / "validation")]
    tokenizer = Path(cfg.data.tokenizer.path) if cfg.data.tokenizer.path else cfg.run_dir / TOKENIZER_SUBDIR
    if not validation or not (tokenizer / "tokenizer.json").is_file():
        return None
    return train, validation, tokenizer


def figures_key(cfg: Any, base: Path) -> dict[str, Any] | None:
    """What a run's unigram figures depend on, to key their cache (the report's ``unigram.json``): the data
    (train and validation paths, sequence length, sequences per domain) and the tokenizer (its directory
    and the SHA-256 of its ``tokenizer.json``, so that a tokenizer retrained in place counts as another).
    Paths are relative to ``base`` (the report directory), so a committed report names no machine's
    absolute path and its cache holds in another checkout of the same layout. None where the run has no
    figures."""
    import hashlib

    sources = validation_sources(cfg)
    if sources is None:
        return None
    train, validation, tokenizer = sources
    base = Path(base).resolve()

    def rel(path: str | Path) -> str:
        return Path(os.path.relpath(Path(path).resolve(), base)).as_posix()

    return {"train_paths": [rel(p) for p in train], "validation_paths": [rel(p) for p in validation],
            "seq_len": int(cfg.data.seq_len), "max_sequences_per_domain": cfg.eval.max_sequences_per_domain,
            "tokenizer": rel(tokenizer),
            "tokenizer_sha256": hashlib.sha256((tokenizer / "tokenizer.json").read_bytes()).hexdigest()}


def run_validation_figures(cfg: Any) -> dict[str, float]:
    """The unigram figures of a pre-training run's validation sequences (``cfg``: its RunConfig).

    Reads the same sequences as the run's evaluation (``eval.max_sequences_per_domain`` per domain)
    with its tokenizer (see :func:`validation_sources`). {} for fine-tuning runs (their loss is on
    responses only) and runs without validation data.
    """
    from d3ray.data.evaluation import load_eval_sequences
    from d3ray.data.tokenizer import load_backend_tokenizer

    sources = validation_sources(cfg)
    if sources is None:
        return {}
    train, validation, tokenizer = sources
    sets = load_eval_sequences(validation, cfg.data, tokenizer, cfg.eval.max_sequences_per_domain)
    backend, _ = load_backend_tokenizer(tokenizer)
    counts = token_counts(train, cfg.data, tokenizer, backend.get_vocab_size())
    return eval_set_figures(sets, counts)
