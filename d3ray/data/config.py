"""Typed configuration of the data stage, and the canonical domain labels.

Domains are named as SlimPajama names them (``meta.redpajama_set_name``). RedPajama-1T stores each
domain in its own folder (``arxiv/``, ``c4-rp/``, ``cc/`` ...); :func:`canonical_domain` maps those
folder names onto the SlimPajama labels so that both layouts yield the same domain names. Any other
corpus names its text and domain fields (``text_key``, ``domain_key``, dotted for nested ones), or
takes its domains from its files or folders (layouts ``file``, ``folder``), and then may leave the
domain list to the corpus (``domains: []``, resolved by :func:`d3ray.data.corpus.resolve_corpus`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

LAYOUTS = ("auto", "slimpajama", "redpajama_1t", "folder", "file", "path")
#: Layouts whose domains the shard listing names (no record is read to know them): ``domains: []`` works.
LISTING_LAYOUTS = ("redpajama_1t", "folder", "file", "path")
DEFAULT_TEXT_KEY = "text"
DEFAULT_DOMAIN_KEY = "meta.redpajama_set_name"
DEFAULT_MAX_RECORD_BYTES = 64 * 1024 * 1024
#: ``data.tokenize_actors=0`` sizes the tokenizers to the free CPUs, up to this many (a cap, so that one run's
#: stream does not take every CPU of a large node from other work).
AUTO_TOKENIZE_MAX = 16

DEFAULT_DOMAINS = (
    "RedPajamaArXiv",
    "RedPajamaBook",
    "RedPajamaC4",
    "RedPajamaCommonCrawl",
    "RedPajamaGithub",
    "RedPajamaStackExchange",
    "RedPajamaWikipedia",
)

# RedPajama-1T folder names (and a few common spellings) -> SlimPajama set names.
FOLDER_DOMAINS = {
    "arxiv": "RedPajamaArXiv",
    "book": "RedPajamaBook",
    "books": "RedPajamaBook",
    "c4": "RedPajamaC4",
    "c4-rp": "RedPajamaC4",
    "cc": "RedPajamaCommonCrawl",
    "common_crawl": "RedPajamaCommonCrawl",
    "commoncrawl": "RedPajamaCommonCrawl",
    "github": "RedPajamaGithub",
    "stackexchange": "RedPajamaStackExchange",
    "wiki": "RedPajamaWikipedia",
    "wikipedia": "RedPajamaWikipedia",
}


def auto_tokenize_actors(free_cpus: float, tokenize_cpus: float) -> int:
    """Tokenizers for ``data.tokenize_actors=0``: one per ``tokenize_cpus`` of ``free_cpus`` (the cluster's
    CPUs less what the trainers and the scheduler's actors reserve), at least 1, at most ``AUTO_TOKENIZE_MAX``
    (a tokenizer reserving no CPU: the maximum)."""
    if tokenize_cpus <= 0:
        return AUTO_TOKENIZE_MAX
    return max(1, min(AUTO_TOKENIZE_MAX, int(free_cpus // tokenize_cpus)))


def canonical_domain(label: str) -> str:
    """The SlimPajama set name for a RedPajama-1T folder name; any other label unchanged.

    >>> canonical_domain("c4-rp"), canonical_domain("RedPajamaC4"), canonical_domain("code")
    ('RedPajamaC4', 'RedPajamaC4', 'code')
    """
    return FOLDER_DOMAINS.get(label.lower(), label)


@dataclass(frozen=True, kw_only=True)
class TokenizerConfig:
    """How to get the tokenizer: train a byte-level BPE on the training shards, or load one."""

    vocab_size: int = 4096
    """Target vocabulary size of the trained BPE, special tokens included (ignored with ``path``)."""
    path: str | None = None
    """Local Hugging Face tokenizer directory to load instead of training one (no hub downloads)."""
    train_docs: int = 2000
    """How many training documents to sample (deterministically) for BPE training."""
    train_chars_per_doc: int = 20_000
    """Each sampled document is cut to this many characters, so a whole book cannot dominate."""
    split_digits: bool = False
    """Make every digit its own pre-token (never merged), as LLaMA and PaLM do; for arithmetic SFT."""

    def __post_init__(self) -> None:
        if self.vocab_size < 300:
            raise ValueError(
                f"tokenizer.vocab_size must be >= 300 (256 bytes + merges), got {self.vocab_size}"
            )
        if self.train_docs < 1:
            raise ValueError(f"tokenizer.train_docs must be >= 1, got {self.train_docs}")
        if self.train_chars_per_doc < 1:
            raise ValueError(f"tokenizer.train_chars_per_doc must be >= 1, got {self.train_chars_per_doc}")


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Where the corpus is, how it is laid out, and how it is tokenized and packed."""

    train_paths: list[str] = field(default_factory=list)
    """Training shards: folders, globs or URIs (s3://, gs://, hf://, memory://, file://).
    Empty means the generated sample corpus (see ``write_sample_corpus``)."""
    validation_paths: list[str] = field(default_factory=list)
    """Held-out shards for per-domain validation loss; empty means the sample corpus' validation split."""
    layout: str = "auto"
    """Where a record's domain comes from: ``slimpajama`` (the record's ``domain_key`` field),
    ``auto`` (that field when a record has it, else the folder name mapped as ``redpajama_1t`` maps it),
    ``redpajama_1t`` (the shard's folder name, RedPajama-1T names mapped onto SlimPajama's:
    ``c4-rp`` → ``RedPajamaC4``), ``folder`` (the folder name as it is: one folder = one domain),
    ``file`` (the file name without its suffix: one file = one domain) or ``path`` (each of
    ``train_paths`` is a domain named after its folder, made unique, or each of its subfolders when its
    files sit in two or more; validation paths pair with them by name, else by order). A run whose
    records carry no ``domain_key`` and whose ``domains`` are left at their default takes ``path``
    (see :func:`d3ray.data.corpus.resolve_corpus`)."""
    text_key: str = DEFAULT_TEXT_KEY
    """The record field (JSON key or parquet/arrow column) holding the text; dotted for a nested one
    (``body.text``)."""
    domain_key: str = DEFAULT_DOMAIN_KEY
    """The record field holding the domain (layouts ``slimpajama`` and ``auto``); dotted for a nested
    one, as SlimPajama's ``meta.redpajama_set_name``."""
    seq_len: int = 128
    """T: tokens per packed training sequence."""
    domains: list[str] = field(default_factory=lambda: list(DEFAULT_DOMAINS))
    """Known domain labels; a record of any other domain is a bad record (``unknown_domain``). ``[]``:
    every domain the corpus' folders, files or paths name (layouts ``folder``, ``file``, ``redpajama_1t``,
    ``path``), in listing order, resolved and logged before the run starts. Left at this default on a
    corpus whose records have no ``domain_key`` (and whose folders are no RedPajama names): the domains
    come from the data paths (layout ``path``)."""
    max_bad_fraction: float = 0.01
    """Stop with an error once more than this fraction of the records read are bad."""
    min_records_before_check: int = 1000
    """The bad fraction is checked on the corpus' first this many records before the run starts (on all of
    them, if it has fewer), while the run reads once it has read this many, and at the run's end."""
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    """A line longer than this is a bad record (``oversized_record``), so no line is held whole."""
    tokenize_actors: int = 1
    """Tokenizer parallelism: shards read and tokenized at once, one Ray task each (no actor). With fewer
    shards than this (one large shard), a pool of this many tokenizer actors shares out its blocks.
    0 = size it to the cluster: one per ``tokenize_cpus`` of the CPUs left once the trainers and the
    scheduler's actors have theirs (at least 1, at most ``AUTO_TOKENIZE_MAX``), resolved and logged at start."""
    tokenize_cpus: float = 1.0
    """CPUs reserved per tokenizer task (or actor). Lower it (e.g. 0.5) when the trainers hold every CPU of a
    small box: the tasks need free CPUs to start, or the stream waits for them."""
    tokenize_batch_size: int = 256
    """Documents per tokenizer call (and per block out of a read task)."""
    block_bytes: int = 2 * 1024 * 1024
    """Ray Data target block size of the stream. Ray's default (128 MiB) would hold back a whole
    shard's tokens until the shard is done; small blocks reach the trainer as soon as they are made."""
    mix_shared_span_blocks: int = 32
    """Mixing: one shared reader feeds per-domain queues while they reach back at most this many blocks
    (of ``tokenize_batch_size`` documents); a domain the mixture wants faster than that then reads on a
    lane of its own (``d3ray/data/domain_lanes.py``). Bounds the queues' memory and what a resume
    re-reads. 0: a lane per domain from the start."""
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    """The tokenizer to train or load."""

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"data.layout must be one of {list(LAYOUTS)}, got {self.layout!r}")
        if self.seq_len < 2:
            raise ValueError(f"data.seq_len must be >= 2, got {self.seq_len}")
        if not self.domains and self.layout not in LISTING_LAYOUTS:
            raise ValueError(
                f"data.domains=[] (the corpus' own domains) needs a layout whose folders or files name the "
                f"domains ({', '.join(LISTING_LAYOUTS)}), not data.layout={self.layout}; list the domains "
                f"(`d3ray data inspect PATH --domains any` shows the corpus' own), set --data.layout=folder (or path), "
                f"or leave data.domains out: records without {self.domain_key!r} then take their domains from the "
                f"data paths")
        for name in ("text_key", "domain_key"):
            key = getattr(self, name)
            if not key or "" in key.split("."):
                raise ValueError(f"data.{name} must be a field name, dotted for a nested one, got {key!r}")
        if len(set(self.domains)) != len(self.domains):
            raise ValueError(f"data.domains has duplicates: {self.domains}")
        if not 0.0 <= self.max_bad_fraction <= 1.0:
            raise ValueError(f"data.max_bad_fraction must be in [0, 1], got {self.max_bad_fraction}")
        if self.min_records_before_check < 0:
            raise ValueError(
                f"data.min_records_before_check must be >= 0, got {self.min_records_before_check}"
            )
        if self.max_record_bytes < 1:
            raise ValueError(f"data.max_record_bytes must be >= 1, got {self.max_record_bytes}")
        if self.tokenize_actors < 0:
            raise ValueError(f"data.tokenize_actors must be >= 1, or 0 to size it to the cluster; got {self.tokenize_actors}")
        if self.block_bytes < 1024:
            raise ValueError(f"data.block_bytes must be >= 1024, got {self.block_bytes}")
        if self.tokenize_cpus < 0:
            raise ValueError(f"data.tokenize_cpus must be >= 0, got {self.tokenize_cpus}")
        if self.mix_shared_span_blocks < 0:
            raise ValueError(f"data.mix_shared_span_blocks must be >= 0, got {self.mix_shared_span_blocks}")
        if self.tokenize_batch_size < 1:
            raise ValueError(f"data.tokenize_batch_size must be >= 1, got {self.tokenize_batch_size}")
