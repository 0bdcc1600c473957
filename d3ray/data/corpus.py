"""The user's corpus as a run sees it: shards listed per config field, domains resolved, a first look.

    data.train_paths / data.validation_paths
      │ field_listing        list_corpus, errors naming the field; the files under the paths that are
      │                      no shard named in one warning; a folder holding several splits (Hugging
      │                      Face names: train/, test-0000.parquet, ...) is refused
      │ domains_from_paths   no sampled record has data.domain_key and data.domains is its default:
      │                      data.layout=path, data.domains=[] (the domains come from the data)
      │ assign_path_domains  layout path: each train path a domain (its folder's name, made unique),
      │                      or each of its subfolders; validation paths paired by name, else by order
      │ resolve_domains      data.domains=[] → the listing's names (layouts folder, file, redpajama_1t,
      │                      path), in listing order
      │ check_records_sample the first records of a few shards: none usable → one line naming the
      │                      field to change (data.text_key, data.domain_key, data.domains, ...)
      │ check_first_records  data.max_bad_fraction on the first data.min_records_before_check records
      ▼                      (all of a smaller corpus)
    Corpus: DataConfig with its domains, train shards, validation shards, the line saying the domains

:func:`prepare_corpus` runs in the driver before any Ray work or tokenizer training, so a corpus the
config cannot read stops at once. The domains are resolved once, here: every later reader (the
stream, the tokenizer sample, evaluation, the mixers' probe) gets the same list and shards.
"""

from __future__ import annotations

import dataclasses
import logging
import posixpath
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from d3ray.data.config import DEFAULT_DOMAINS, DataConfig, canonical_domain
from d3ray.data.ledger import BadRecordFractionError, BadRecordLedger
from d3ray.data.records import Document, iter_documents, listing_domain
from d3ray.data.shards import Listing, Shard, list_corpus
from d3ray.errors import DataPathError, UserError

logger = logging.getLogger(__name__)

#: Hugging Face's split keywords (``datasets.data_files``), by the split they name.
SPLIT_WORDS = {"train": "train", "training": "train", "validation": "validation", "valid": "validation",
               "val": "validation", "dev": "validation", "test": "test", "testing": "test", "eval": "test",
               "evaluation": "test"}
_SPLIT_FILE = re.compile(r"^(" + "|".join(sorted(SPLIT_WORDS, key=len, reverse=True)) + r")(?:[-._ 0-9]|$)")


@dataclass(frozen=True)
class Corpus:
    """A run's corpus, resolved: the data config (domains filled in), the shards, and the line that says
    which domains it found and how (the run prints it)."""

    data: DataConfig
    train: list[Shard]
    validation: list[Shard]
    domains_line: str


def resolve_corpus(data: DataConfig) -> tuple[DataConfig, list[Shard], list[Shard]]:
    """``(data with its domains resolved, train shards, validation shards)``: :func:`prepare_corpus`."""
    corpus = prepare_corpus(data)
    return corpus.data, corpus.train, corpus.validation


def prepare_corpus(data: DataConfig) -> Corpus:
    """List the training and validation shards, resolve ``data.domains`` and check the first records.

    Raises:
        UserError: a path that matches nothing or mixes splits, a sample without one usable record
            (see :func:`check_records_sample`), or too many bad records among the first ones (see
            :func:`check_first_records`); the message names the field and the fix.
    """
    train_listing = field_listing(data.train_paths, "data.train_paths")
    validation_listing = field_listing(data.validation_paths, "data.validation_paths") \
        if data.validation_paths else Listing([], [], [])
    given = data
    data, train, validation = listing_domains(data, train_listing, validation_listing)
    listed = not given.domains or data.layout != given.layout  # the domains are the listing's
    sampled = check_records_sample(train, data, "data.train_paths")  # before a tokenizer is trained on them
    if validation:
        check_records_sample(validation, data, "data.validation_paths")
    whole = check_first_records(train, data, "data.train_paths")
    if validation:
        check_first_records(validation, data, "data.validation_paths")
    line = domains_line(data, whole or sampled, listed, whole is not None)
    logger.info(line)
    return Corpus(data, train, validation, line)


def resolve_listing(data: DataConfig, field: str = "data.train_paths") -> tuple[DataConfig, list[Shard], str]:
    """The training paths alone, as :func:`prepare_corpus` resolves them (listing, domains; no record checks):
    ``(data with its domains, shards, the line saying the domains)``; ``d3ray data inspect`` uses it."""
    listing = field_listing(data.train_paths, field)
    given = data
    data, shards, _ = listing_domains(data, listing, Listing([], [], []))
    listed = not given.domains or data.layout != given.layout
    sampled: Counter[str] = Counter()
    for shard in _spread(shards, 8):
        for n, doc in enumerate(iter_documents(shard, data.layout, data.domains, data.max_record_bytes,
                                               text_key=data.text_key, domain_key=data.domain_key)):
            if n >= 64:
                break
            sampled[doc.domain] += not doc.is_bad
    return data, shards, domains_line(data, sampled, listed)


def listing_domains(data: DataConfig, train: Listing,
                    validation: Listing) -> tuple[DataConfig, list[Shard], list[Shard]]:
    """``data`` with its domains resolved for the listed shards, and the shards (with their domains in
    layout ``path``, which a corpus without a domain field takes: :func:`domains_from_paths`)."""
    if domains_from_paths(data, train.shards) or (data.layout == "path" and list(data.domains) == list(DEFAULT_DOMAINS)):
        data = dataclasses.replace(data, layout="path", domains=[])  # the paths' domains, unless set by hand
    train_shards, validation_shards = train.shards, validation.shards
    if data.layout == "path":
        train_shards, validation_shards = assign_path_domains(train, validation)
    return resolve_domains(data, train_shards), train_shards, validation_shards


def field_listing(paths: Sequence[str], field: str) -> Listing:
    """``list_corpus(paths)`` for the config field ``field``: errors name the field, and the files under the
    paths that are not read are named in one warning.

    Raises:
        DataPathError: a path matches no shard file, or a folder holds files of several splits.
    """
    try:
        listing = list_corpus(list(paths))
    except DataPathError as err:
        raise DataPathError(f"{field}: {err}") from None
    if listing.ignored:
        logger.warning(listing.ignored_line(field))
    splits = shard_splits(listing.shards)
    if len(splits) > 1:
        wanted = "validation" if "validation" in field else "train"
        example = splits.get(wanted) or next(iter(splits.values()))
        raise DataPathError(f"{field}: {paths} holds the splits {sorted(splits)} (Hugging Face split names in "
                            f"its folder or file names), which would be read as one corpus; give one split, "
                            f"e.g. {example!r}")
    return listing


def field_shards(paths: Sequence[str], field: str) -> list[Shard]:
    """The shards of :func:`field_listing`."""
    return field_listing(paths, field).shards


def domains_from_paths(data: DataConfig, shards: Sequence[Shard], per_shard: int = 64, max_shards: int = 8) -> bool:
    """Whether the domains come from the data paths (layout ``path``): ``data.layout`` is ``auto``,
    ``data.domains`` its default, no record of a sample has ``data.domain_key``, and the shards' folders are
    not RedPajama-1T's (``c4-rp``, ``arxiv``, ...: those keep layout ``auto``, as SlimPajama corpora do)."""
    if data.layout != "auto" or list(data.domains) != list(DEFAULT_DOMAINS) or not shards:
        return False
    picked = _spread(shards, max_shards)
    if all(canonical_domain(s.folder) in data.domains for s in picked):
        return False
    for shard in picked:
        docs = iter_documents(shard, "slimpajama", None, data.max_record_bytes, text_key=data.text_key,
                              domain_key=data.domain_key)
        for n, doc in enumerate(docs):
            if doc.domain:  # the record has the domain field (bad records keep it too)
                return False
            if n + 1 >= per_shard:
                break
    return True


def path_units(listing: Listing) -> list[tuple[str, list[Shard]]]:
    """The domain-sized units of the paths, in order: each path whose files sit in two or more subfolders
    (and none beside them) gives one unit per subfolder, named after it; any other path is one unit, named
    after its folder (a file's: the folder holding it)."""
    units: list[tuple[str, list[Shard]]] = []
    for _, shards in listing.groups:
        if not shards:
            continue
        below = [s.name.split("/")[1:] for s in shards]
        subfolders = list(dict.fromkeys(b[0] for b in below if len(b) >= 2))
        if len(subfolders) >= 2 and all(len(b) >= 2 for b in below):
            units += [(sub, [s for s, b in zip(shards, below, strict=True) if b[0] == sub]) for sub in subfolders]
        else:
            units.append((shards[0].name.split("/")[0], list(shards)))
    return units


def assign_path_domains(train: Listing, validation: Listing) -> tuple[list[Shard], list[Shard]]:
    """Layout ``path``: the train and validation shards, each with its domain (``Shard.domain``).

    Each unit of :func:`path_units` of the training paths is a domain named after it, made unique
    (``web``, ``web_2``); validation units pair with them by name when every one names a training domain,
    else by order (as many units as the training paths have); with one training domain, every validation
    record belongs to it.

    Raises:
        UserError: the validation units pair with the training domains neither by name nor by order.
    """
    names: list[str] = []
    out_train: list[Shard] = []
    for name, shards in path_units(train):
        unique, k = name, 1
        while unique in names:
            k += 1
            unique = f"{name}_{k}"
        names.append(unique)
        out_train += [dataclasses.replace(s, domain=unique) for s in shards]
    order = {s.uri: i for i, s in enumerate(train.shards)}
    out_train.sort(key=lambda s: order[s.uri])
    units = path_units(validation)
    if len(names) == 1:
        pairs = [names[0]] * len(units)
    elif all(name in names for name, _ in units):
        pairs = [name for name, _ in units]
    elif len(units) == len(names):
        pairs = names
    else:
        raise UserError(
            f"data.validation_paths: its folders {[n for n, _ in units]} pair with the training domains {names} "
            f"(data.layout=path: one per training path or subfolder) neither by name nor by order ({len(units)} "
            f"against {len(names)}); name the validation folders as the training ones, or leave "
            f"data.validation_paths out")
    order = {s.uri: i for i, s in enumerate(validation.shards)}
    out_validation = sorted((dataclasses.replace(s, domain=domain) for domain, (_, shards) in zip(pairs, units,
                             strict=True) for s in shards), key=lambda s: order[s.uri])
    return out_train, out_validation


def domains_line(data: DataConfig, sampled: Counter[str], listed: bool, whole: bool = False) -> str:
    """One line: the run's domains, the good records of each (in the sample, or ``whole``: in the corpus),
    and where they come from."""
    how = {
        "path": f"from the data paths' folder names (the records have no {data.domain_key!r})",
        "folder": "from the folder names", "file": "from the file names",
        "redpajama_1t": "from the RedPajama folder names",
    }.get(data.layout, f"from each record's {data.domain_key!r}" + (" (or its folder)" if data.layout == "auto"
                                                                    else ""))
    if not listed and data.layout != "path":
        how += ", among data.domains"
    shown = [d for d in data.domains if sampled.get(d)] if len(data.domains) > 8 else list(data.domains)
    unit = "records" if whole else "records sampled"
    parts = ", ".join(f"{d} ({sampled.get(d, 0)} {unit})" for d in shown)
    rest = f" and {len(data.domains) - len(shown)} more without {unit}" if len(shown) < len(data.domains) \
        else ""
    return f"domains: {parts}{rest}, {how}"


def check_first_records(shards: Sequence[Shard], cfg: DataConfig, field: str) -> Counter[str] | None:
    """``data.max_bad_fraction`` on the first ``data.min_records_before_check`` records of ``shards`` in reading
    order (all of them when there are fewer): what the run would check first, checked before it starts.

    Returns:
        The good records per domain when that was every record of ``shards`` (a small corpus), else None.

    Raises:
        BadRecordFractionError: too many of them are bad; the message names the field, the worst file, its
            reasons and first lines, and the flag.
    """
    limit = cfg.min_records_before_check
    if not limit:
        return None
    ledger = BadRecordLedger(log_first=0)
    good: Counter[str] = Counter()
    complete = True
    for shard in shards:
        for doc in iter_documents(shard, cfg.layout, cfg.domains, cfg.max_record_bytes, text_key=cfg.text_key,
                                  domain_key=cfg.domain_key):
            if ledger.total >= limit:
                complete = False
                break
            ledger.record(doc)
            good[doc.domain] += not doc.is_bad
        if not complete:
            break
    try:
        ledger.check(cfg.max_bad_fraction)
    except BadRecordFractionError as err:
        which = f"all {ledger.total} records" if complete else f"the first {ledger.total} records"
        raise BadRecordFractionError(f"{field}: {which}: {err}") from None
    return +good if complete else None


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
    unit = {"file": "file", "path": "data path"}.get(data.layout, "folder")
    logger.info("data.domains: %s (data.domains=[]: the %s names of data.train_paths, data.layout=%s)",
                domains, unit, data.layout)
    return dataclasses.replace(data, domains=domains)


def _spread(shards: Sequence[Shard], n: int) -> list[Shard]:
    """Up to ``n`` shards spread evenly over the listing."""
    n_used = min(len(shards), n)
    return [shards[(i * len(shards)) // n_used] for i in range(n_used)]


def check_records_sample(shards: Sequence[Shard], cfg: Any, field: str, per_shard: int = 64,
                         max_shards: int = 8) -> Counter[str]:
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

    Returns:
        The good records per domain of the sample.

    Raises:
        UserError: no good record in the sample, or a sampled columnar file lacks ``cfg.text_key``;
            the message names the field to change (``data.text_key``, ``data.domain_key``,
            ``data.domains``), the file, and the fix.
    """
    good: Counter[str] = Counter()
    if not shards:
        return good
    picked = _spread(shards, max_shards)
    n_used = len(picked)
    _check_columns(picked, cfg)
    reasons: Counter[str] = Counter()
    seen: Counter[str] = Counter()  # domains of unknown_domain records
    first_bad: Document | None = None
    for shard in picked:
        docs = iter_documents(shard, cfg.layout, cfg.domains, cfg.max_record_bytes,
                              text_key=cfg.text_key, domain_key=cfg.domain_key)
        for n, doc in enumerate(docs):
            if n >= per_shard:
                break
            if not doc.is_bad:
                good[doc.domain] += 1
                continue
            reasons[doc.bad_reason] += 1
            first_bad = first_bad or doc
            if doc.bad_reason == "unknown_domain":
                seen[doc.domain or "(none)"] += 1
    if good:
        return good
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
