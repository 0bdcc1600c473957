"""Evaluation inputs: parse ``KIND=FILE`` task specs and read each kind's local files, validated.

Every file is read and checked here, in the calling process, before any model work starts (and
before anything is shipped to a Ray worker): a bad line is an :class:`EvalInputError` naming the
file, the 1-based line and the field. Evaluation sets are not skipped around: a dropped example
would silently change the metric. The one exception is ``domains``, which reads pre-training
shards with d3ray's corpus reader and, as training does, counts bad lines in a
:class:`~d3ray.data.ledger.BadRecordLedger` (reported with the results) instead of stopping.

| kind | file | one example |
|---|---|---|
| ppl | plain UTF-8 text (e.g. WikiText-2 ``wiki.test.raw``) | the whole file, one document |
| domains | SlimPajama-format ``.jsonl[.zst]`` shards (file or folder) | a document, by ``meta.redpajama_set_name`` |
| cloze | JSONL ``{"context", "continuation"}`` (LAMBADA layout) | one line |
| choice | JSONL ``{"context", "choices": [...], "label": int}`` (OBQA/COPA/HellaSwag/PIQA) | one line |
| sft | SFT JSONL (the skill suite's ``test/``; file or folder) | one record |
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from d3ray.data.ledger import BadRecordLedger
from d3ray.data.records import iter_documents
from d3ray.data.shards import JSONL_SUFFIXES, Shard, TruncatedStreamError, iter_shard_lines, list_shards
from d3ray.errors import UserError

KINDS = ("ppl", "domains", "cloze", "choice", "sft")


class EvalInputError(UserError, ValueError):
    """A task spec or an evaluation file is not what its kind needs; says which file, line and field
    (a :class:`~d3ray.errors.UserError`: the command line prints it as one line)."""


@dataclass(frozen=True)
class EvalTask:
    """One ``KIND=FILE`` task; ``name`` keys its metrics (``eval/<name>/<metric>``)."""

    kind: str
    path: str
    name: str


def parse_task_specs(spec: str | list[str]) -> list[EvalTask]:
    """``"cloze=a.jsonl,choice=b.jsonl"`` (or a list of ``KIND=FILE``) → tasks named ``<kind>:<stem>``.

    Raises:
        EvalInputError: an unknown kind, a missing ``=``, or two tasks with the same name.
    """
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    tasks: list[EvalTask] = []
    for item in (i.strip() for i in items):
        if not item:
            continue
        kind, sep, path = item.partition("=")
        if not sep or not path:
            raise EvalInputError(f"task spec {item!r} is not KIND=FILE (kinds: {', '.join(KINDS)})")
        if kind not in KINDS:
            raise EvalInputError(f"task spec {item!r}: unknown kind {kind!r}; kinds are {', '.join(KINDS)}")
        tasks.append(EvalTask(kind=kind, path=path, name=f"{kind}:{_stem(path)}"))
    names = [t.name for t in tasks]
    if len(set(names)) != len(names):
        raise EvalInputError(f"two tasks have the same name (kind:file stem) in {names}; rename a file")
    if not tasks:
        raise EvalInputError("no tasks given; expected KIND=FILE[,KIND=FILE...]")
    return tasks


def _stem(path: str) -> str:
    name = Path(path.rstrip("/")).name
    for suffix in (*JSONL_SUFFIXES, ".raw", ".txt"):
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return name


def read_text_document(path: str) -> str:
    """A plain text file as one document (UTF-8, not empty)."""
    file = Path(path)
    if not file.is_file():
        raise EvalInputError(f"{path}: no such file (kind ppl wants a plain text file)")
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise EvalInputError(f"{path}: not UTF-8 text at byte {err.start} (kind ppl wants plain text)") from err
    if not text.strip():
        raise EvalInputError(f"{path}: the file is empty")
    return text


def iter_jsonl_objects(path: str, kind: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line, object)`` for each non-blank line of one JSONL file (``.jsonl``, ``.zst``, ``.gz``)."""
    if not path.endswith(JSONL_SUFFIXES):
        raise EvalInputError(f"{path}: kind {kind} wants a JSONL file ({', '.join(JSONL_SUFFIXES)})")
    if not Path(path).is_file():
        raise EvalInputError(f"{path}: no such file")
    shard = Shard(uri=path, name=path, folder=Path(path).parent.name)
    try:
        for line in iter_shard_lines(shard, max_line_bytes=16 * 1024 * 1024):
            line_no, data = line.number, line.data
            if data is None:
                raise EvalInputError(f"{path} line {line_no}: longer than 16 MiB")
            if not data.strip():
                continue
            try:
                obj = json.loads(data.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as err:
                raise EvalInputError(f"{path} line {line_no}: not a JSON line ({err})") from err
            if not isinstance(obj, dict):
                raise EvalInputError(f"{path} line {line_no}: a JSON {type(obj).__name__}, not an object")
            yield line_no, obj
    except TruncatedStreamError as err:
        raise EvalInputError(f"{path}: {err.reason} ({err.detail})") from err


def _text_field(obj: dict[str, Any], key: str, where: str) -> str:
    if key not in obj:
        raise EvalInputError(f"{where}: missing field {key!r} (keys: {sorted(obj)[:8]})")
    value = obj[key]
    if not isinstance(value, str):
        raise EvalInputError(f"{where}: field {key!r} is a {type(value).__name__}, not a string")
    if not value.strip():
        raise EvalInputError(f"{where}: field {key!r} is empty")
    return value


def read_cloze(path: str) -> list[dict[str, Any]]:
    """``{"context", "continuation"}`` lines → docs (joined by ``harness.cloze_target``: one space between
    them unless either side already has it)."""
    docs = []
    for line_no, obj in iter_jsonl_objects(path, "cloze"):
        where = f"{path} line {line_no}"
        docs.append({"context": _text_field(obj, "context", where), "continuation": _text_field(obj, "continuation", where)})
    return _non_empty(docs, path)


def read_choice(path: str) -> list[dict[str, Any]]:
    """``{"context", "choices", "label"}`` lines → docs; ``label`` indexes ``choices`` (0-based)."""
    docs = []
    for line_no, obj in iter_jsonl_objects(path, "choice"):
        where = f"{path} line {line_no}"
        context = _text_field(obj, "context", where)
        choices = obj.get("choices")
        if not isinstance(choices, list) or len(choices) < 2:
            raise EvalInputError(f"{where}: field 'choices' must be a list of at least 2 strings, got {choices!r:.60}")
        for i, choice in enumerate(choices):
            if not isinstance(choice, str) or not choice.strip():
                raise EvalInputError(f"{where}: choices[{i}] is {choice!r:.40}, not a non-empty string")
        label = obj.get("label")
        if not isinstance(label, int) or isinstance(label, bool):
            raise EvalInputError(f"{where}: field 'label' is {label!r:.40}, not an integer index into 'choices'")
        if not 0 <= label < len(choices):
            raise EvalInputError(f"{where}: field 'label' = {label} is out of range for {len(choices)} choices")
        docs.append({"context": context, "choices": choices, "label": label})
    return _non_empty(docs, path)


def read_domain_documents(
    path: str, ledger: BadRecordLedger, max_docs_per_domain: int | None = None
) -> dict[str, list[str]]:
    """Documents per domain of SlimPajama-format shards (any domain label); bad lines counted in ``ledger``."""
    try:
        shards = list_shards([path])
    except FileNotFoundError as err:
        raise EvalInputError(f"kind domains: {err}") from err
    out: dict[str, list[str]] = {}
    for shard in shards:
        for doc in iter_documents(shard, "auto", None):
            ledger.record(doc)
            if doc.is_bad:
                continue
            docs = out.setdefault(doc.domain, [])
            if max_docs_per_domain is None or len(docs) < max_docs_per_domain:
                docs.append(doc.text)
    if not out:
        raise EvalInputError(f"{path}: no good documents ({ledger.total_bad} bad records)")
    return dict(sorted(out.items()))


def _non_empty(docs: list[dict[str, Any]], path: str) -> list[dict[str, Any]]:
    if not docs:
        raise EvalInputError(f"{path}: no examples (the file has no non-blank lines)")
    return docs
