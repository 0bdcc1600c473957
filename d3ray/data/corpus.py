"""The user's corpus as a run sees it: shards listed per config field, domains resolved, a first look.

    data.train_paths / data.validation_paths
      │ field_shards         list_shards, errors naming the field; a folder holding several splits
      │                      (Hugging Face names: train/, test-0000.parquet, ...) is refused
      │ resolve_domains      data.domains=[] → the folders' or files' names (layouts folder, file,
      │                      redpajama_1t), in listing order, logged
      │ check_records_sample the first records of a few shards: none usable → one line naming the
      ▼                      field to change (data.text_key, data.domain_key, data.domains, ...)
    (DataConfig with its domains, train shards, validation shards)

:func:`resolve_corpus` runs in the driver before any Ray work or tokenizer training, so a corpus the
config cannot read stops at once. The domains are resolved once, here: every later reader (the
stream, the tokenizer sample, evaluation, the mixers' probe) gets the same list.
"""

from __future__ import annotations

import dataclasses
import logging
import posixpath
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

from d3ray.data.config import DataConfig
from d3ray.data.records import Document, iter_documents, listing_domain
from d3ray.data.shards import Shard, list_shards
from d3ray.errors import DataPathError, UserError

logger = logging.getLogger(__name__)

#: Hugging Face's split keywords (``datasets.data_files``), by the split they name.
SPLIT_WORDS = {"train": "train", "training": "train", "validation": "validation", "valid": "validation",
               "val": "validation", "dev": "validation", "test": "test", "testing": "test", "eval": "test",
               "evaluation": "test"}
_SPLIT_FILE = re.compile(r"^(" + "|".join(sorted(SPLIT_WORDS, key=len, reverse=True)) + r")(?:[-._ 0-9]|$)")


def resolve_corpus(data: DataConfig) -> tuple[DataConfig, list[Shard], list[Shard]]:
    """List the training and validation shards, resolve ``data.domains`` and check a sample of records.

    Returns:
        ``(data with its domains resolved, train shards, validation shards)``.

    Raises:
        UserError: a path that matches nothing or mixes splits, or a sample without one usable record
            (see :func:`check_records_sample`); the message names the field and the fix.
    """
    train = field_shards(data.train_paths, "data.train_paths")
    validation = field_shards(data.validation_paths, "data.validation_paths") if data.validation_paths else []
    data = resolve_domains(data, train)
    check_records_sample(train, data, "data.train_paths")  # before a tokenizer is trained on them
    if validation:
        check_records_sample(validation, data, "data.validation_paths")
    return data, train, validation


def field_shards(paths: Sequence[str], field: str) -> list[Shard]:
    """``list_shards(paths)`` for the config field ``field``; errors name the field.

    Raises:
        DataPathError: a path matches no shard file, or a folder holds files of several splits.
    """
    try:
        shards = list_shards(list(paths))
    except DataPathError as err:
        raise DataPathError(f"{field}: {err}") from None
    splits = shard_splits(shards)
    if len(splits) > 1:
        wanted = "validation" if "validation" in field else "train"
        example = splits.get(wanted) or next(iter(splits.values()))
        raise DataPathError(f"{field}: {paths} holds the splits {sorted(splits)} (Hugging Face split names in "
                            f"its folder or file names), which would be read as one corpus; give one split, "
                            f"e.g. {example!r}")
    return shards


def shard_splits(shards: Sequence[Shard]) -> dict[str, str]:
    """Split → a path (folder or glob) of its files, for the shards whose names below their listed folder
    follow Hugging Face's split naming (a folder ``train/``, a file ``test-00000-of-00001.parquet``)."""
    out: dict[str, str] = {}
    for shard in shards:
        parts = shard.name.split("/")[1:]  # below the listed folder (the first part is its own name)
        if not parts:
            continue  # a file given by its own path
        prefix = shard.uri[: len(shard.uri) - len("/".join(parts))]
        folder = next((k for k, part in enumerate(parts[:-1]) if part.lower() in SPLIT_WORDS), None)
        if folder is not None:
            out.setdefault(SPLIT_WORDS[parts[folder].lower()], prefix + "/".join(parts[: folder + 1]))
        elif match := _SPLIT_FILE.match(parts[-1].lower()):
            glob = "/".join([*parts[:-1], parts[-1][: match.end(1)] + "*"])
            out.setdefault(SPLIT_WORDS[match.group(1)], prefix + glob)
    return out


def resolve_domains(data: DataConfig, shards: Sequence[Shard]) -> DataConfig:
    """``data`` with ``domains`` filled from the listing when it is ``[]`` (logged); else ``data`` itself."""
    if data.domains:
        return data
    domains = list(dict.fromkeys(str(listing_domain(s, data.layout)) for s in shards))
    logger.info("data.domains: %s (data.domains=[]: the %s names of data.train_paths, data.layout=%s)",
                domains, "file" if data.layout == "file" else "folder", data.layout)
    return dataclasses.replace(data, domains=domains)


def check_records_sample(shards: Sequence[Shard], cfg: Any, field: str, per_shard: int = 64,
                         max_shards: int = 8) -> None:
    """Stop before any training when a sample of a corpus' records holds no usable record.

    Reads the first ``per_shard`` records of up to ``max_shards`` shards spread over the listing (a
    few milliseconds). A plain ``{"text": ...}`` corpus in ``mydata/train/`` gets the folder name
    ``train`` as its domain, which is not among the default ``data.domains``: every record would be
    bad, and a tokenizer trained on none of them. Some good records pass (the run's ledger then
    enforces ``data.max_bad_fraction``), except that a sampled parquet/arrow file without the text
    column stops the run: no row of it could ever be read.

    Args:
        shards: the listed shards of ``field``.
        cfg: the :class:`~d3ray.data.config.DataConfig` (layout, keys, domains, max_record_bytes).
        field: the config field the shards come from, for the message (``data.train_paths``).

    Raises:
        UserError: no good record in the sample, or a sampled columnar file lacks ``cfg.text_key``;
            the message names the field to change (``data.text_key``, ``data.domain_key``,
            ``data.domains``), the file, and the fix.
    """
    if not shards:
        return
    n_used = min(len(shards), max_shards)
    picked = [shards[(i * len(shards)) // n_used] for i in range(n_used)]
    _check_columns(picked, cfg)
    reasons: Counter[str] = Counter()
    seen: Counter[str] = Counter()  # domains of unknown_domain records
    first_bad: Document | None = None
    found_good = False
    for shard in picked:
        docs = iter_documents(shard, cfg.layout, cfg.domains, cfg.max_record_bytes,
                              text_key=cfg.text_key, domain_key=cfg.domain_key)
        for n, doc in enumerate(docs):
            if not doc.is_bad:
                found_good = True
                break
            reasons[doc.bad_reason] += 1
            first_bad = first_bad or doc
            if doc.bad_reason == "unknown_domain":
                seen[doc.domain or "(none)"] += 1
            if n + 1 >= per_shard:
                break
        if found_good:
            return
    total = sum(reasons.values())
    if not total:
        raise UserError(f"{field}: the {n_used} files sampled hold no record (only blank lines); check the paths")
    assert first_bad is not None
    where = f"the first {total} records of {n_used} file(s) of {field}"
    first = f"first: {first_bad.shard} line {first_bad.line}, {first_bad.detail}"
    if reasons["missing_text"] == total:
        raise UserError(
            f"data.text_key: none of {where} has the field {cfg.text_key!r} ({first}); set "
            f"--data.text_key=<the field holding the text> (dotted for a nested one: body.text)")
    if reasons["unknown_domain"] == total:
        raise UserError(_unknown_domains_message(cfg, field, where, sorted(seen)))
    raise UserError(
        f"{field}: none of {where} is usable (by reason {dict(sorted(reasons.items()))}; first {first_bad.shard} "
        f"line {first_bad.line}: {first_bad.bad_reason}, {first_bad.detail}); fix the records, or check "
        f"data.layout / data.domains (`d3ray data inspect` counts every bad record by reason)")


def _check_columns(shards: Sequence[Shard], cfg: Any) -> None:
    """A sampled parquet/arrow file without the text column: one line naming it (its schema, no rows)."""
    import pyarrow as pa

    from d3ray.data.columnar import find_field, read_schema

    for shard in shards:
        if not shard.columnar:
            continue
        try:
            schema = read_schema(shard)
        except (pa.ArrowException, OSError) as err:  # the reader counts it as a corrupt_columnar record
            logger.warning("%s: not readable as %s (%s)", shard.name, posixpath.splitext(shard.uri)[1], err)
            continue
        if find_field(schema, cfg.text_key) is None:
            raise UserError(
                f"data.text_key: {shard.uri} has no column {cfg.text_key!r} (columns: {schema.names[:12]}); set "
                f"--data.text_key=<the column holding the text> (dotted for a struct field: meta.body), or "
                f"leave that file out of the data paths")


def _unknown_domains_message(cfg: Any, field: str, where: str, seen: list[str]) -> str:
    known = list(cfg.domains)
    if seen == ["(none)"]:  # layout slimpajama, and no record carries the domain field
        return (f"data.domain_key: {where} have no domain field {cfg.domain_key!r} (data.layout={cfg.layout}); set "
                f"--data.domain_key=<the field naming each record's domain>, or take the domains from the "
                f"corpus' folders or files: --data.layout=folder (or file) --data.domains='[]'")
    unit = "file" if cfg.layout == "file" else "folder"
    if field == "data.validation_paths" and cfg.layout in ("folder", "file", "redpajama_1t"):
        return (f"data.validation_paths: {where} are of domains {seen[:8]}, not among the training corpus' "
                f"{known[:8]} (data.layout={cfg.layout}); name the validation {unit}s as the training ones, or "
                f"leave data.validation_paths out")
    if cfg.layout == "auto":
        why = f"with data.layout=auto, a record without {cfg.domain_key} takes its folder's name as its domain"
    elif cfg.layout == "slimpajama":
        why = f"data.layout=slimpajama: each record's {cfg.domain_key}"
    else:
        why = f"data.layout={cfg.layout} names each record's domain by its {unit}"
    return (f"data.domains: {where} are all of unknown domains {seen[:8]} (known: {known[:8]}); "
            f"set --data.domains='[{', '.join(seen[:8])}]' ({why}), or make every folder a domain with "
            f"--data.layout=folder --data.domains='[]'")
