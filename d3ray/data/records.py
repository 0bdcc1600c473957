"""Parse shard records into documents, and account for every bad record.

Every record of a shard (a non-blank JSONL line, or a parquet/arrow row) becomes exactly one
:class:`Document`: a good one (text and domain) or a bad one whose ``bad_reason`` says why. Nothing
is dropped silently, and a bad record never costs the good ones around it: a truncated ``.zst``
stream yields every complete line before the cut and then one ``truncated_zstd`` record.
The readers count every document into a :class:`~d3ray.data.ledger.BadRecordLedger`
(``ledger.py``). Whitespace-only lines are not records (JSONL writers often end files with a blank line).

The text is the record's ``text_key`` field and the domain, by layout, its ``domain_key`` field
(``slimpajama``; ``auto`` falls back to the folder) or the shard's folder or file name (``redpajama_1t``,
``folder``, ``file``) or data path (``path``): :func:`listing_domain`. Keys are dotted for nested fields (``meta.redpajama_set_name``).

Each document carries its :class:`~d3ray.data.shards.ShardPosition`, so a reader can resume at
any record. A per-domain reader (``lane=<domain>``) keeps only the records that belong to its
domain: a shard whose listing names its domain is skipped whole by the other lanes; on mixed-domain
JSONL shards (SlimPajama) a cheap byte probe for the domain key decides most lines without parsing
their JSON; a record with no known domain (malformed JSON, an unknown domain, ...) belongs to exactly
one lane, ``unattributed_lane``, so that it is counted once however many lanes read the shard.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from d3ray.data.config import DEFAULT_DOMAIN_KEY, DEFAULT_MAX_RECORD_BYTES, DEFAULT_TEXT_KEY, canonical_domain
from d3ray.data.shards import Shard, ShardPosition, TruncatedStreamError, iter_shard_lines

logger = logging.getLogger(__name__)

BAD_REASONS = (
    "malformed_json",  # not JSON, or JSON that is not an object
    "missing_text",  # no text field (data.text_key), or no such column
    "non_string_text",  # the text field is not a string (or is null)
    "empty_text",  # the text is empty or whitespace only
    "undecodable_bytes",  # the line is not UTF-8, or the text holds lone surrogates
    "truncated_zstd",  # the .zst stream ends inside a frame or is corrupt
    "truncated_gzip",  # the .gz stream ends early or is corrupt
    "truncated_bz2",  # the .bz2 stream ends early or is corrupt
    "corrupt_columnar",  # a parquet/arrow file, row group or record batch pyarrow cannot read
    "unknown_domain",  # no domain, or one not in DataConfig.domains
    "oversized_record",  # the line (text) is longer than DataConfig.max_record_bytes
)


@dataclass(frozen=True)
class Document:
    """One record of a shard: good (``bad_reason == ""``) or bad (``text == ""``, reason set).

    ``line`` is 1-based (a row number in a columnar shard). ``detail`` is a short human explanation of
    a bad record. ``offset``, ``frame_offset`` and ``frame_start`` are the record's
    :class:`~d3ray.data.shards.ShardPosition`.
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


def listing_domain(shard: Shard, layout: str) -> str | None:
    """The domain the shard's listing names (layouts ``redpajama_1t``, ``folder``, ``file``, ``path``), or
    None when each record names its own (``slimpajama``, ``auto``)."""
    if layout == "path":  # assigned with the listing (d3ray.data.corpus); else the listed folder's name
        return shard.domain or shard.name.split("/")[0]
    if layout == "redpajama_1t":
        return canonical_domain(shard.folder)
    if layout == "folder":
        return shard.folder
    if layout == "file":
        return shard.stem
    return None


class _Fields:
    """How one shard's records give their text and domain (the keys split once, the probe compiled once)."""

    def __init__(self, shard: Shard, layout: str, text_key: str, domain_key: str) -> None:
        self.text_key, self.domain_key = text_key, domain_key
        self.text_path, self.domain_path = tuple(text_key.split(".")), tuple(domain_key.split("."))
        self.named = listing_domain(shard, layout)
        self.fallback = canonical_domain(shard.folder) if layout == "auto" else ""
        # SlimPajama's set names go through canonical_domain (as folder names do); a user's labels stay as given.
        self.canonical = domain_key == DEFAULT_DOMAIN_KEY
        leaf = json.dumps(self.domain_path[-1]).encode()
        self.probe_key = leaf
        self.probe = re.compile(re.escape(leaf) + rb'\s*:\s*"([^"\\]*)"')

    def domain(self, value: Any) -> str:
        """The record's domain from its domain field's value (``None`` when it has none)."""
        if self.named is not None:
            return self.named
        if isinstance(value, str) and value:
            return canonical_domain(value) if self.canonical else value
        return self.fallback


def iter_documents(
    shard: Shard,
    layout: str,
    domains: Sequence[str] | None,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    start: ShardPosition | None = None,
    lane: str | None = None,
    unattributed_lane: str | None = None,
    *,
    text_key: str = DEFAULT_TEXT_KEY,
    domain_key: str = DEFAULT_DOMAIN_KEY,
) -> Iterator[Document]:
    """Stream a shard's records, one :class:`Document` per non-blank line (or row), in file order.

    The domain is the record's ``domain_key`` field (layout ``slimpajama``; a SlimPajama set name is
    mapped by :func:`~d3ray.data.config.canonical_domain`), that field when present and else the
    shard's folder name mapped the same way (``auto``), or what :func:`listing_domain` names
    (``redpajama_1t``, ``folder``, ``file``; the record's fields are not read for it).

    Args:
        shard: the shard to read (JSONL, or parquet/arrow: :mod:`d3ray.data.columnar`).
        layout: one of :data:`~d3ray.data.config.LAYOUTS`.
        domains: the known domain labels; any other is ``unknown_domain``. ``None`` accepts any
            non-empty label (for inspecting a corpus of unknown domains).
        max_record_bytes: longer lines (texts) are ``oversized_record``.
        start: resume at this record (a position from an earlier read), not at the first one.
        lane: keep only the records of this domain (a per-domain reader); ``None`` keeps all.
        unattributed_lane: the lane that keeps the records of no known domain (only with ``lane``).
        text_key, domain_key: the text and domain fields, dotted for nested ones.
    """
    known = frozenset(domains) if domains is not None else None
    fields = _Fields(shard, layout, text_key, domain_key)
    if lane is not None and fields.named is not None and fields.named != lane:
        if not (unattributed_lane == lane and (known is None or fields.named not in known)):
            return  # every record of this shard belongs to another lane
    if shard.columnar:
        yield from _columnar_documents(shard, fields, known, max_record_bytes, start, lane, unattributed_lane)
        return
    probe = lane is not None and fields.named is None and known is not None
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
                owner = _probe_domain(data, fields) if probe else None
                if owner is not None and owner != lane and owner in known:  # type: ignore[operator]
                    continue  # another lane's record, decided without parsing it
                doc = _parse_line(data, shard, line.number, known, fields)
                if lane is not None and owner != lane and not _owned(doc, known, lane, unattributed_lane):
                    continue
            yield _at(doc, line.offset, line.frame_offset, line.frame_start)
    except TruncatedStreamError as err:
        at = err.position or position
        if lane is None or unattributed_lane == lane:
            yield _at(_bad(shard, at.line, err.reason, err.detail), at.offset, at.frame_offset, at.frame_start)


def _owned(doc: Document, known: frozenset[str] | None, lane: str, unattributed_lane: str | None) -> bool:
    """Whether ``lane`` keeps ``doc``: its domain's lane, or the unattributed lane for no known domain."""
    owner = doc.domain if (known is None or doc.domain in known) else None
    return owner == lane or (owner is None and unattributed_lane == lane)


def _at(doc: Document, offset: int, frame_offset: int, frame_start: int) -> Document:
    return Document(doc.text, doc.domain, doc.shard, doc.line, doc.bad_reason, doc.detail, offset, frame_offset,
                    frame_start)


def _probe_domain(data: bytes, fields: _Fields) -> str | None:
    """The domain of a JSONL line read from its bytes, or None when the bytes leave it unclear.

    JSON escapes every quote inside a string, so an unescaped ``"<domain field>"`` followed by a
    colon is a key of the record itself (at some depth); the probe trusts it only when it occurs
    exactly once.
    """
    at = data.rfind(fields.probe_key)
    if at < 0 or data.find(fields.probe_key) != at:
        return None
    match = fields.probe.match(data, at)
    if match is None:
        return None
    try:
        return fields.domain(match.group(1).decode("utf-8"))
    except UnicodeDecodeError:
        return None


def _lookup(record: dict[str, Any], key: str, path: tuple[str, ...]) -> tuple[bool, Any]:
    """``(found, value)`` of a dotted field; a key holding the dots itself wins."""
    if key in record:
        return True, record[key]
    node: Any = record
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _parse_line(data: bytes, shard: Shard, line_no: int, known: frozenset[str] | None, fields: _Fields) -> Document:
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
    # bad records keep their domain for reports
    domain = fields.domain(None if fields.named is not None else _lookup(record, fields.domain_key,
                                                                         fields.domain_path)[1])
    found, text = _lookup(record, fields.text_key, fields.text_path)
    if not found:
        detail = f"no field {fields.text_key!r}; keys: {sorted(record)[:8]}"
        return _bad(shard, line_no, "missing_text", detail, domain)
    return _judge(text, domain, shard, line_no, known, fields)


def _judge(text: Any, domain: str, shard: Shard, line_no: int, known: frozenset[str] | None,
           fields: _Fields) -> Document:
    """The document of a record whose text field is present (value ``text``) and whose domain is ``domain``."""
    if not isinstance(text, str):
        kind = "null" if text is None else f"a {type(text).__name__}"
        return _bad(shard, line_no, "non_string_text", f"{fields.text_key} is {kind}", domain)
    if not text.strip():
        return _bad(shard, line_no, "empty_text", f"{fields.text_key} is {text[:20]!r}", domain)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:  # JSON escapes can encode lone surrogates
        return _bad(shard, line_no, "undecodable_bytes", str(err), domain)
    if not domain or (known is not None and domain not in known):
        return _bad(shard, line_no, "unknown_domain", f"domain {domain!r}", domain)
    return Document(text=text, domain=domain, shard=shard.name, line=line_no)


def _columnar_documents(shard: Shard, fields: _Fields, known: frozenset[str] | None, max_record_bytes: int,
                        start: ShardPosition | None, lane: str | None,
                        unattributed_lane: str | None) -> Iterator[Document]:
    """The rows of a parquet/arrow shard as documents (the same rules as a JSONL line's)."""
    from d3ray.data.columnar import field_values, iter_column_batches

    keys = [fields.text_key] if fields.named is not None else [fields.text_key, fields.domain_key]
    for batch in iter_column_batches(shard, keys, start):
        if batch.error or batch.table is None:
            if lane is None or unattributed_lane == lane:
                at = batch.position(0)
                yield _at(_bad(shard, at.line, "corrupt_columnar", batch.error), at.offset, at.frame_offset,
                          at.frame_start)
            continue
        texts = field_values(batch.table, fields.text_key)
        labels = field_values(batch.table, fields.domain_key) if fields.named is None else None
        missing = f"no column {fields.text_key!r}; columns: {list(batch.columns)[:8]}"
        for i in range(batch.n_rows):
            domain = fields.domain(labels[i] if labels is not None else None)
            line_no = batch.first_row + i + 1
            if texts is None:
                doc = _bad(shard, line_no, "missing_text", missing, domain)
            elif isinstance(texts[i], str) and len(texts[i]) * 4 > max_record_bytes and \
                    len(texts[i].encode("utf-8", "surrogatepass")) > max_record_bytes:
                doc = _bad(shard, line_no, "oversized_record", f"text longer than {max_record_bytes} bytes", domain)
            else:
                doc = _judge(texts[i], domain, shard, line_no, known, fields)
            if lane is not None and not _owned(doc, known, lane, unattributed_lane):
                continue
            yield _at(doc, line_no - 1, batch.group, batch.group_start)


def _bad(shard: Shard, line_no: int, reason: str, detail: str, domain: str = "") -> Document:
    return Document(text="", domain=domain, shard=shard.name, line=line_no, bad_reason=reason, detail=detail)
