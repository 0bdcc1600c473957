"""The data stage: shards → documents → tokens → packed per-domain T-token sequences.

Pure modules (``shards``, ``records``, ``packing``, ``sample``, ``report``) import no Ray; the
Ray Data stream (``pipeline``) and the tokenizer/evaluation helpers are imported on first use,
so importing ``d3ray.data`` (and ``d3ray --help``) stays fast. See README.md in this folder.
"""

from __future__ import annotations

import importlib
from typing import Any

from d3ray.data.config import DEFAULT_DOMAINS, DataConfig, TokenizerConfig, canonical_domain
from d3ray.data.labels import IGNORE_INDEX, batch_width, lm_labels
from d3ray.data.ledger import BadRecordFractionError, BadRecordLedger
from d3ray.data.mixture import draw_domains, require_mixable, validate_mixture
from d3ray.data.packing import PackedSequence, SequencePacker, TokenizedDocument, parse_sample_id
from d3ray.data.records import BAD_REASONS, Document, iter_documents
from d3ray.data.report import CorpusReport, inspect
from d3ray.data.sample import write_sample_corpus
from d3ray.data.sft import SFT_BAD_REASONS, SftDataConfig, SftRecord, iter_sft_records, render_record
from d3ray.data.sft_sequences import SftStats, iter_sft_sequences, read_sft_records
from d3ray.data.shards import Shard, ShardPosition, list_shards
from d3ray.data.skills import check_answer, generate_suite, write_sft_suite

_LAZY = {
    "document_dataset": "d3ray.data.pipeline",
    "iter_packed_sequences": "d3ray.data.corpus_source",
    "CorpusSource": "d3ray.data.corpus_source",
    "ensure_tokenizer": "d3ray.data.tokenizer",
    "load_tokenizer": "d3ray.data.tokenizer",
    "train_tokenizer": "d3ray.data.tokenizer",
    "train_tokenizer_from_texts": "d3ray.data.tokenizer",
    "load_eval_sequences": "d3ray.data.evaluation",
    "load_text_file_sequences": "d3ray.data.evaluation",
}

__all__ = [
    "BAD_REASONS",
    "DEFAULT_DOMAINS",
    "IGNORE_INDEX",
    "SFT_BAD_REASONS",
    "SftDataConfig",
    "SftRecord",
    "SftStats",
    "batch_width",
    "check_answer",
    "generate_suite",
    "iter_sft_records",
    "iter_sft_sequences",
    "lm_labels",
    "read_sft_records",
    "render_record",
    "write_sft_suite",
    "BadRecordFractionError",
    "BadRecordLedger",
    "CorpusReport",
    "DataConfig",
    "Document",
    "PackedSequence",
    "SequencePacker",
    "Shard",
    "ShardPosition",
    "TokenizedDocument",
    "TokenizerConfig",
    "canonical_domain",
    "draw_domains",
    "inspect",
    "iter_documents",
    "list_shards",
    "parse_sample_id",
    "require_mixable",
    "validate_mixture",
    "write_sample_corpus",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'd3ray.data' has no attribute {name!r}")
