"""``inspect``: what a corpus holds, per domain and per shard, bad records included.

A quick, streaming pass over shards (no Ray) that counts records, tokens and bad records, so a
user can check a corpus (its domains, its size in tokens, its broken lines) before training on
it. Tokens are counted with a given tokenizer, or as whitespace-separated words without one.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from d3ray.data.config import DEFAULT_DOMAIN_KEY, DEFAULT_DOMAINS, DEFAULT_MAX_RECORD_BYTES, DEFAULT_TEXT_KEY
from d3ray.data.ledger import BadRecordLedger
from d3ray.data.records import Document, iter_documents
from d3ray.data.shards import Shard, list_corpus

logger = logging.getLogger(__name__)

_ENCODE_BATCH = 256


@dataclass
class Counts:
    """Records (good + bad), bad records and tokens (of good records) of one domain or shard."""

    records: int = 0
    bad: int = 0
    tokens: int = 0


@dataclass
class CorpusReport:
    """Result of :func:`inspect`. ``token_unit`` is ``"tokens"`` or ``"words"`` (no tokenizer)."""

    paths: list[str]
    token_unit: str
    domains: dict[str, Counts] = field(default_factory=lambda: defaultdict(Counts))
    shards: dict[str, Counts] = field(default_factory=lambda: defaultdict(Counts))
    bad_by_reason: dict[str, dict[str, int]] = field(default_factory=dict)
    """shard -> reason -> count."""
    first_bad_lines: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    """shard -> reason -> first line numbers."""

    @property
    def total(self) -> Counts:
        return Counts(
            records=sum(c.records for c in self.shards.values()),
            bad=sum(c.bad for c in self.shards.values()),
            tokens=sum(c.tokens for c in self.shards.values()),
        )

    def to_dict(self) -> dict[str, Any]:
        total = self.total
        return {
            "paths": self.paths,
            "token_unit": self.token_unit,
            "total": vars(total),
            "domains": {d: vars(c) for d, c in sorted(self.domains.items())},
            "shards": {s: vars(c) for s, c in self.shards.items()},
            "bad_by_reason": self.bad_by_reason,
            "first_bad_lines": self.first_bad_lines,
        }

    def format_table(self) -> str:
        """A readable plain-text report: domains, shards, then bad records by reason."""
        unit = self.token_unit
        lines = [f"corpus: {', '.join(self.paths)}", ""]
        for title, rows in (("domain", self.domains), ("shard", self.shards)):
            width = max([len(title), *(len(k) for k in rows)]) + 2
            lines.append(f"{title:<{width}}{'records':>10}{'bad':>8}{unit:>14}")
            for key in sorted(rows) if title == "domain" else rows:
                c = rows[key]
                lines.append(f"{key:<{width}}{c.records:>10,}{c.bad:>8,}{c.tokens:>14,}")
            t = self.total
            lines += [f"{'total':<{width}}{t.records:>10,}{t.bad:>8,}{t.tokens:>14,}", ""]
        if self.bad_by_reason:
            lines.append("bad records:")
            for shard, reasons in self.bad_by_reason.items():
                for reason, count in reasons.items():
                    first = self.first_bad_lines[shard][reason]
                    lines.append(f"  {shard}: {reason} x{count} (first lines {first})")
        else:
            lines.append("bad records: none")
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def inspect(
    paths: str | Sequence[str],
    tokenizer_dir: str | Path | None = None,
    layout: str = "auto",
    domains: Sequence[str] | None = DEFAULT_DOMAINS,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    text_key: str = DEFAULT_TEXT_KEY,
    domain_key: str = DEFAULT_DOMAIN_KEY,
    shards: Sequence[Shard] | None = None,
) -> CorpusReport:
    """Count records, tokens and bad records per domain and per shard.

    Args:
        paths: folders, globs or URIs of shards.
        tokenizer_dir: count tokens with this tokenizer; ``None`` counts whitespace-separated words.
        layout: one of :data:`~d3ray.data.config.LAYOUTS`.
        domains: known domains (others are bad, ``unknown_domain``); ``None`` accepts any label.
        max_record_bytes: longer lines are bad (``oversized_record``).
        text_key, domain_key: the text and domain fields (``data.text_key``, ``data.domain_key``).
        shards: the shards of ``paths`` as a run resolves them (their domains in layout ``path``); None lists
            ``paths``, naming the files that are not read in one warning.
    """
    paths = [str(paths)] if isinstance(paths, (str, Path)) else [str(p) for p in paths]
    backend = None
    if tokenizer_dir is not None:
        from d3ray.data.tokenizer import load_backend_tokenizer

        backend, _ = load_backend_tokenizer(tokenizer_dir)
    report = CorpusReport(paths=paths, token_unit="tokens" if backend else "words")
    ledger = BadRecordLedger(keep_lines=10, log_first=0)

    def count_tokens(docs: list[Document]) -> None:
        if backend is not None:
            lengths = [
                len(e.ids)
                for e in backend.encode_batch_fast([d.text for d in docs], add_special_tokens=False)
            ]
        else:
            lengths = [len(d.text.split()) for d in docs]
        for doc, n in zip(docs, lengths, strict=True):
            report.domains[doc.domain].tokens += n
            report.shards[doc.shard].tokens += n

    if shards is None:
        listing = list_corpus(paths)
        if listing.ignored:
            logger.warning(listing.ignored_line("data inspect"))
        shards = listing.shards
    for shard in shards:
        report.shards[shard.name] = Counts()
        pending: list[Document] = []
        for doc in iter_documents(shard, layout, domains, max_record_bytes, text_key=text_key, domain_key=domain_key):
            ledger.record(doc)
            domain = doc.domain or "(unknown)"
            report.domains[domain].records += 1
            report.shards[doc.shard].records += 1
            if doc.is_bad:
                report.domains[domain].bad += 1
                report.shards[doc.shard].bad += 1
                continue
            pending.append(doc)
            if len(pending) >= _ENCODE_BATCH:
                count_tokens(pending)
                pending = []
        if pending:
            count_tokens(pending)
    report.domains = dict(report.domains)
    report.shards = dict(report.shards)
    report.bad_by_reason = {s: dict(sorted(c.items())) for s, c in ledger.bad.items() if c}
    report.first_bad_lines = {
        s: {r: ledger.first_lines[(s, r)] for r in sorted(c)} for s, c in ledger.bad.items() if c
    }
    return report
