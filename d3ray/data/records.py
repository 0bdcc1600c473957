"""Parse shard lines into documents, and account for every bad record.

Every line of a shard becomes exactly one :class:`Document`: a good one (text and domain) or a
bad one whose ``bad_reason`` says why. Nothing is dropped silently, and a bad line never costs
the good lines around it: a truncated ``.zst`` stream yields every complete line before the cut
and then one ``truncated_zstd`` record. :class:`BadRecordLedger` counts bad records per shard and
per reason, keeps the first line numbers of each, and stops a run whose bad fraction is too high.
Whitespace-only lines are not records (JSONL writers often end files with a blank line).

Each document carries its :class:`~d3ray.data.shards.ShardPosition`, so a reader can resume at
any record. A per-domain reader (``lane=<domain>``) keeps only the records that belong to its
domain: on mixed-domain shards (SlimPajama) a cheap byte probe for ``"redpajama_set_name"``
decides most lines without parsing their JSON; a record with no known domain (malformed JSON,
an unknown domain, ...) belongs to exactly one lane, ``unattributed_lane``, so that it is counted
once however many lanes read the shard.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from d3ray.data.config import DEFAULT_MAX_RECORD_BYTES, canonical_domain
from d3ray.data.shards import Shard, ShardPosition, TruncatedStreamError, iter_shard_lines
from d3ray.errors import UserError

logger = logging.getLogger(__name__)

BAD_REASONS = (
    "malformed_json",  # not JSON, or JSON that is not an object
    "missing_text",  # no "text" key
    "non_string_text",  # "text" is not a string
    "empty_text",  # "text" is empty or whitespace only
    "undecodable_bytes",  # the line is not UTF-8, or the text holds lone surrogates
    "truncated_zstd",  # the .zst stream ends inside a frame or is corrupt
    "truncated_gzip",  # the .gz stream ends early or is corrupt
    "unknown_domain",  # no domain, or one not in DataConfig.domains
    "oversized_record",  # the line is longer than DataConfig.max_record_bytes
)

_SET_NAME_KEY = b'"redpajama_set_name"'
_SET_NAME = re.compile(rb'"redpajama_set_name"\s*:\s*"([^"\\]*)"')


@dataclass(frozen=True)
class Document:
    """One record of a shard: good (``bad_reason == ""``) or bad (``text == ""``, reason set).

    ``line`` is 1-based. ``detail`` is a short human explanation of a bad record. ``offset``,
    ``frame_offset`` and ``frame_start`` are the record's :class:`~d3ray.data.shards.ShardPosition`.
    """

    text: str
    domain: str
    shard: str
    line: int
    bad_reason: str = ""
    detail: str = ""
    offset: int = 0
    frame_offset: int = 0
    frame_start: int = 0

    @property
    def position(self) -> ShardPosition:
        return ShardPosition(self.line, self.offset, self.frame_offset, self.frame_start)

    @property
    def is_bad(self) -> bool:
        return bool(self.bad_reason)


def iter_documents(
    shard: Shard,
    layout: str,
    domains: Sequence[str] | None,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    start: ShardPosition | None = None,
    lane: str | None = None,
    unattributed_lane: str | None = None,
) -> Iterator[Document]:
    """Stream a shard's records, one :class:`Document` per non-blank line, in file order.

    The domain is ``meta.redpajama_set_name`` (layout ``slimpajama``), the shard's folder name
    mapped by :func:`~d3ray.data.config.canonical_domain` (``redpajama_1t``; ``meta`` may be
    absent), or the set name when present and else the folder (``auto``).

    Args:
        shard: the shard to read.
        layout: ``auto``, ``slimpajama`` or ``redpajama_1t``.
        domains: the known domain labels; any other is ``unknown_domain``. ``None`` accepts any
            non-empty label (for inspecting a corpus of unknown domains).
        max_record_bytes: longer lines are ``oversized_record``.
        start: resume at this record (a position from an earlier read), not at the first line.
        lane: keep only the records of this domain (a per-domain reader); ``None`` keeps all.
        unattributed_lane: the lane that keeps the records of no known domain (only with ``lane``).
    """
    known = frozenset(domains) if domains is not None else None
    folder_domain = canonical_domain(shard.folder)
    if lane is not None and layout == "redpajama_1t" and folder_domain != lane:
        if not (unattributed_lane == lane and (known is None or folder_domain not in known)):
            return  # every record of this shard belongs to another lane
    probe = lane is not None and layout != "redpajama_1t" and known is not None
    position = start or ShardPosition()
    try:
        for line in iter_shard_lines(shard, max_record_bytes, start):
            position = line.position
            data = line.data
            if data is None:
                doc = _bad(shard, line.number, "oversized_record", f"longer than {max_record_bytes} bytes")
            elif not data or data.isspace():
                continue
            else:
                owner = _probe_domain(data) if probe else None
                if owner is not None and owner != lane and owner in known:  # type: ignore[operator]
                    continue  # another lane's record, decided without parsing it
                doc = _parse_line(data, shard, line.number, layout, known, folder_domain)
                if lane is not None and owner != lane:
                    owner = doc.domain if (known is None or doc.domain in known) else None
                    if owner != lane and not (owner is None and unattributed_lane == lane):
                        continue
            yield dataclasses.replace(
                doc, offset=line.offset, frame_offset=line.frame_offset, frame_start=line.frame_start
            )
    except TruncatedStreamError as err:
        at = err.position or position
        if lane is None or unattributed_lane == lane:
            doc = _bad(shard, at.line, err.reason, err.detail)
            yield dataclasses.replace(doc, offset=at.offset, frame_offset=at.frame_offset, frame_start=at.frame_start)


def _probe_domain(data: bytes) -> str | None:
    """The set name of a SlimPajama line read from its bytes, or None when the bytes leave it unclear.

    JSON escapes every quote inside a string, so an unescaped ``"redpajama_set_name"`` is a key (or
    a string value) of the record itself; the probe trusts it only when it occurs exactly once.
    """
    at = data.rfind(_SET_NAME_KEY)
    if at < 0 or data.find(_SET_NAME_KEY) != at:
        return None
    match = _SET_NAME.match(data, at)
    if match is None:
        return None
    try:
        return canonical_domain(match.group(1).decode("utf-8"))
    except UnicodeDecodeError:
        return None


def _parse_line(
    data: bytes, shard: Shard, line_no: int, layout: str, known: frozenset[str] | None, folder_domain: str
) -> Document:
    try:
        line = data.decode("utf-8")
    except UnicodeDecodeError as err:
        return _bad(shard, line_no, "undecodable_bytes", str(err))
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        return _bad(shard, line_no, "malformed_json", str(err))
    if not isinstance(record, dict):
        return _bad(shard, line_no, "malformed_json", f"a JSON {type(record).__name__}, not an object")
    domain = _domain_of(record, layout, folder_domain)  # bad records keep their domain for reports
    if "text" not in record:
        return _bad(shard, line_no, "missing_text", f"keys: {sorted(record)[:8]}", domain)
    text = record["text"]
    if not isinstance(text, str):
        return _bad(shard, line_no, "non_string_text", f"text is a {type(text).__name__}", domain)
    if not text.strip():
        return _bad(shard, line_no, "empty_text", f"text is {text[:20]!r}", domain)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:  # JSON escapes can encode lone surrogates
        return _bad(shard, line_no, "undecodable_bytes", str(err), domain)
    if not domain or (known is not None and domain not in known):
        return _bad(shard, line_no, "unknown_domain", f"domain {domain!r}", domain)
    return Document(text=text, domain=domain, shard=shard.name, line=line_no)


def _domain_of(record: dict[str, Any], layout: str, folder_domain: str) -> str:
    if layout == "redpajama_1t":
        return folder_domain
    meta = record.get("meta")
    set_name = meta.get("redpajama_set_name") if isinstance(meta, dict) else None
    if isinstance(set_name, str) and set_name:
        return canonical_domain(set_name)
    return "" if layout == "slimpajama" else folder_domain


def _bad(shard: Shard, line_no: int, reason: str, detail: str, domain: str = "") -> Document:
    return Document(text="", domain=domain, shard=shard.name, line=line_no, bad_reason=reason, detail=detail)


class BadRecordFractionError(UserError, RuntimeError):
    """Too large a fraction of the records read are bad; the message names the worst shard."""


class BadRecordLedger:
    """Counts of good and bad records per shard, with the first bad line numbers per reason.

    Args:
        keep_lines: how many line numbers to keep per (shard, reason).
        log_first: how many bad records to log one by one (the rest only in :meth:`log_summary`).
    """

    def __init__(self, keep_lines: int = 10, log_first: int = 10) -> None:
        self.keep_lines = keep_lines
        self.log_first = log_first
        self.good: Counter[str] = Counter()  # shard -> good records
        self.bad: dict[str, Counter[str]] = defaultdict(Counter)  # shard -> reason -> count
        self.first_lines: dict[tuple[str, str], list[int]] = defaultdict(list)  # (shard, reason) -> distinct lines
        self._logged = 0

    def record_good(self, shard: str, count: int = 1) -> None:
        self.good[shard] += count

    def record_bad(self, shard: str, line: int, reason: str, detail: str = "") -> None:
        self.bad[shard][reason] += 1
        lines = self.first_lines[(shard, reason)]
        if len(lines) < self.keep_lines and line not in lines:  # a later epoch reads the same lines again
            lines.append(line)
        if self._logged < self.log_first:
            self._logged += 1
            logger.warning("bad record %s line %d: %s (%s)", shard, line, reason, detail)

    def record(self, doc: Document) -> None:
        """Count one document, good or bad."""
        if doc.is_bad:
            self.record_bad(doc.shard, doc.line, doc.bad_reason, doc.detail)
        else:
            self.record_good(doc.shard)

    @property
    def total_good(self) -> int:
        return sum(self.good.values())

    @property
    def total_bad(self) -> int:
        return sum(sum(c.values()) for c in self.bad.values())

    @property
    def total(self) -> int:
        return self.total_good + self.total_bad

    @property
    def bad_fraction(self) -> float:
        return self.total_bad / self.total if self.total else 0.0

    def bad_by_reason(self) -> dict[str, int]:
        out: Counter[str] = Counter()
        for counts in self.bad.values():
            out.update(counts)
        return dict(sorted(out.items()))

    def worst_shard(self) -> str | None:
        """The shard with the highest bad fraction (ties: more bad records, then name)."""
        if not self.bad:
            return None

        def key(shard: str) -> tuple[float, int, str]:
            n_bad = sum(self.bad[shard].values())
            return (-n_bad / (n_bad + self.good[shard]), -n_bad, shard)

        return min((s for s in self.bad if sum(self.bad[s].values())), key=key, default=None)

    def describe_shard(self, shard: str) -> str:
        n_bad = sum(self.bad[shard].values())
        parts = [
            f"{reason} x{count} (first lines {self.first_lines[(shard, reason)]})"
            for reason, count in sorted(self.bad[shard].items())
        ]
        return f"{shard}: {n_bad} bad of {n_bad + self.good[shard]} records: " + ", ".join(parts)

    def check(self, max_bad_fraction: float) -> None:
        """Raise :class:`BadRecordFractionError` if the bad fraction exceeds ``max_bad_fraction``."""
        if self.bad_fraction > max_bad_fraction:
            worst = self.worst_shard()
            raise BadRecordFractionError(
                f"{self.total_bad} of {self.total} records are bad ({self.bad_fraction:.2%} > "
                f"max_bad_fraction {max_bad_fraction:.2%}); by reason {self.bad_by_reason()}; "
                f"worst file {self.describe_shard(worst) if worst else '-'}"
            )

    def log_summary(self) -> None:
        """Log totals, then one line per shard with bad records."""
        logger.info(
            "records: %d good, %d bad (%.3f%%) %s",
            self.total_good,
            self.total_bad,
            100 * self.bad_fraction,
            self.bad_by_reason() or "",
        )
        for shard in sorted(self.bad):
            logger.warning("bad records in %s", self.describe_shard(shard))

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-safe state (for checkpoints, reports and :meth:`merge`)."""
        return {
            "good": dict(sorted(self.good.items())),
            "bad": {shard: dict(sorted(c.items())) for shard, c in sorted(self.bad.items())},
            "first_lines": {f"{s}\t{r}": lines for (s, r), lines in sorted(self.first_lines.items())},
            "total_good": self.total_good,
            "total_bad": self.total_bad,
            "bad_fraction": self.bad_fraction,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], keep_lines: int = 10, log_first: int = 10) -> BadRecordLedger:
        ledger = cls(keep_lines=keep_lines, log_first=log_first)
        ledger.merge(data)
        return ledger

    def merge(self, other: BadRecordLedger | dict[str, Any]) -> None:
        """Add another ledger's counts (e.g. from another read task or process) into this one."""
        data = other.to_dict() if isinstance(other, BadRecordLedger) else other
        self.good.update(data["good"])
        for shard, counts in data["bad"].items():
            self.bad[shard].update(counts)
        for key, lines in data["first_lines"].items():
            shard, reason = key.split("\t", 1)
            kept = self.first_lines[(shard, reason)]
            kept[:] = sorted(set(kept) | set(lines))[: self.keep_lines]


def check_records_sample(shards: Sequence[Shard], cfg: Any, field: str, per_shard: int = 64,
                         max_shards: int = 8) -> None:
    """Stop before any training when a sample of a corpus' records holds no usable record.

    Reads the first ``per_shard`` records of up to ``max_shards`` shards spread over the listing (a
    few milliseconds). A plain ``{"text": ...}`` corpus in ``mydata/train/`` gets the folder name
    ``train`` as its domain, which is not among the default ``data.domains``: every record would be
    bad, and a tokenizer trained on none of them. Some good records pass (the run's ledger then
    enforces ``data.max_bad_fraction``).

    Args:
        shards: the listed shards of ``field``.
        cfg: the :class:`~d3ray.data.config.DataConfig` (layout, domains, max_record_bytes).
        field: the config field the shards come from, for the message (``data.train_paths``).

    Raises:
        UserError: no good record in the sample; the message names ``data.domains`` / ``data.layout``
            and the domains seen when they are the cause, else the bad reasons and a first bad line.
    """
    if not shards:
        return
    n_used = min(len(shards), max_shards)
    picked = [shards[(i * len(shards)) // n_used] for i in range(n_used)]
    reasons: Counter[str] = Counter()
    seen: Counter[str] = Counter()  # domains of unknown_domain records
    first_bad: Document | None = None
    for shard in picked:
        for n, doc in enumerate(iter_documents(shard, cfg.layout, cfg.domains, cfg.max_record_bytes)):
            if not doc.is_bad:
                return
            reasons[doc.bad_reason] += 1
            first_bad = first_bad or doc
            if doc.bad_reason == "unknown_domain":
                seen[doc.domain or "(none)"] += 1
            if n + 1 >= per_shard:
                break
    total = sum(reasons.values())
    if not total:
        raise UserError(f"{field}: the {n_used} files sampled hold no record (only blank lines); check the paths")
    where = f"the first {total} records of {n_used} file(s) of {field}"
    if reasons["unknown_domain"] == total:
        domains = sorted(seen)
        raise UserError(
            f"data.domains: {where} are all of unknown domains {domains[:8]} (known: {list(cfg.domains)[:8]}); "
            f"set --data.domains='[{', '.join(domains[:8])}]' (with data.layout={cfg.layout}, a record without "
            f"meta.redpajama_set_name takes its folder's name as its domain), or lay out one folder per domain")
    assert first_bad is not None
    raise UserError(
        f"{field}: none of {where} is usable (by reason {dict(sorted(reasons.items()))}; first {first_bad.shard} "
        f"line {first_bad.line}: {first_bad.bad_reason}, {first_bad.detail}); fix the records, or check "
        f"data.layout / data.domains (`d3ray data inspect` counts every bad record by reason)")
