"""Unigram entropy of the validation text under a run's tokenizer: what "far below unigram" means.

A model that ignores context cannot beat the entropy of the token distribution, so a final eval
loss near it means the model has learnt little more than token frequencies, and no data order can
show anything there. Computed on exactly the tokens the run evaluates on (the per-domain validation
sequences, packed as training data): the plug-in entropy H = −Σ_v p_v ln p_v (nats per token, the
unit of the eval loss) of the token counts, for each domain and for all domains pooled. The plug-in
estimate is biased low by about (V − 1) / (2N) nats (Miller 1955), and it is the entropy of the
eval text's own frequencies, a lower bound of any unigram model's cross-entropy on it: a model far
below it is far below every unigram model.
"""

from __future__ import annotations

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


def eval_set_entropies(eval_sets: Mapping[str, np.ndarray]) -> dict[str, float]:
    """``{domain: H, "mean": mean over domains, "pooled": H of all tokens}`` of per-domain (n, T) token arrays.

    ``mean`` is the figure to hold against ``eval/mean_loss`` (also a mean over domains): it is the
    loss of a unigram model that knows each sequence's domain.
    """
    out = {name: unigram_entropy(tokens) for name, tokens in eval_sets.items()}
    if out:
        pooled = np.concatenate([np.asarray(t).ravel() for t in eval_sets.values()])
        out = {**out, "mean": float(np.mean(list(out.values()))), "pooled": unigram_entropy(pooled)}
    return out


def run_validation_entropy(cfg: Any) -> dict[str, float]:
    """Unigram entropies of a pre-training run's validation sequences (``cfg``: its RunConfig).

    Reads the same sequences as the run's evaluation (``eval.max_sequences_per_domain`` per domain)
    with its tokenizer (``data.tokenizer.path`` or ``<run_dir>/tokenizer``); a run on the generated
    corpus reads ``<run_dir>/sample_data/validation``. {} for fine-tuning runs (their loss is on
    responses only) and runs without validation data.
    """
    from d3ray.data.evaluation import load_eval_sequences
    from d3ray.data.tokenizer import TOKENIZER_SUBDIR

    if cfg.sft is not None:
        return {}
    paths = list(cfg.data.validation_paths)
    if not paths and not cfg.data.train_paths:
        paths = [str(cfg.run_dir / "sample_data" / "validation")]
    tokenizer = Path(cfg.data.tokenizer.path) if cfg.data.tokenizer.path else cfg.run_dir / TOKENIZER_SUBDIR
    if not paths or not (tokenizer / "tokenizer.json").is_file():
        return {}
    sets = load_eval_sequences(paths, cfg.data, tokenizer, cfg.eval.max_sequences_per_domain)
    return eval_set_entropies(sets)
