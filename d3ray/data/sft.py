"""SFT records: read and validate them, render prompt and response text with the tokenizer's template.

Records are the lines of ``.jsonl[.zst|.gz]`` files or the rows of ``.parquet`` / ``.arrow`` files (a
saved Hugging Face dataset folder), in one of three layouts (``SftDataConfig.format``, field names
remappable with ``columns`` and ``tags``: :mod:`d3ray.data.sft_formats`). d3ray's own:

    {"prompt": "3+5=", "response": "8", "task": "add1", "difficulty": 1}
    {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...], "task": "chat"}

Alpaca ``{"instruction", "input", "output", "system", "history"}`` and ShareGPT
``{"conversations": [{"from": "human"|"gpt"|"system", "value"}], "system"}`` map onto the same
conversation. ``task`` (the domain of the SFT stream: what mixers, curricula and per-task metrics key on)
defaults to ``SftDataConfig.default_task``; ``difficulty`` is optional. The last message is the
response and must come from the assistant; the earlier ones are the prompt (earlier assistant turns
are context and get no loss).

Every non-blank line (every row) becomes a good :class:`SftRecord` or a bad one whose ``bad_reason`` (one of
:data:`SFT_BAD_REASONS`) and ``detail`` say what is wrong, with the file and 1-based line (row), to be
counted by :class:`~d3ray.data.ledger.BadRecordLedger` exactly like bad pre-training lines.

Rendering (:func:`render_record`): with a tokenizer that has a chat template, the prompt is
``apply_chat_template(prompt messages, add_generation_prompt=True)`` and the response is what the
full conversation adds to it. Without one (the BPE tokenizers d3ray trains), the plain template:

    ### user:\\n{prompt}\\n### assistant:\\n            ← prompt text (no loss)
    {response}<|endoftext|>                          ← response text + EOS (loss)

(each prompt message as ``### {role}:\\n{content}\\n``). Training and evaluation render with this
one function, so a fine-tuned model is evaluated on exactly the prompt format it was trained on.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from d3ray.data.config import DEFAULT_MAX_RECORD_BYTES
from d3ray.data.sft_formats import (
    SFT_FORMATS,
    SftColumns,
    SftFields,
    SftTags,
    record_messages,
    resolve_fields,
)
from d3ray.data.shards import Shard, TruncatedStreamError, iter_shard_lines

SFT_BAD_REASONS = (
    "malformed_json",  # not JSON, or JSON that is not an object
    "undecodable_bytes",  # not UTF-8
    "oversized_record",  # longer than max_record_bytes
    "truncated_zstd",  # the .zst stream ends inside a frame
    "truncated_gzip",  # the .gz stream ends early
    "corrupt_columnar",  # a parquet/arrow file, row group or record batch pyarrow cannot read
    "missing_prompt",  # neither "prompt" nor "messages" (the format's prompt / message list field)
    "non_string_prompt",  # "prompt" is not a string
    "empty_prompt",  # the prompt is empty or whitespace only
    "missing_response",  # "prompt" without "response"
    "non_string_response",  # "response" is not a string
    "empty_response",  # the response is empty or whitespace only
    "bad_messages",  # "messages" is not a list of {role, content} ending with the assistant
    "bad_task",  # "task" is not a non-empty string, or "difficulty" not an integer
)
OVERLONG_RULES = ("truncate_prompt", "skip")
BATCHING = ("pad", "pack")


@dataclass(frozen=True, kw_only=True)
class SftDataConfig:
    """How SFT records become training sequences."""

    paths: list[str] = field(default_factory=list)
    """SFT files or folders of them (.jsonl, .jsonl.zst, .jsonl.gz, .parquet, .arrow; a saved Hugging Face
    dataset folder)."""
    format: str = "d3ray"
    """Record layout: ``d3ray`` ({prompt, response} or {messages: [{role, content}]}), ``alpaca``
    ({instruction, input, output, system, history}) or ``sharegpt`` ({conversations: [{from, value}], system})."""
    columns: SftColumns = field(default_factory=SftColumns)
    """Field names that differ from the format's (LLaMA-Factory ``columns``): ``--sft.columns.prompt=question``."""
    tags: SftTags = field(default_factory=SftTags)
    """Message keys and roles that differ from the format's (LLaMA-Factory ``tags``):
    ``--sft.tags.role_tag=role --sft.tags.user_tag=user``."""
    seq_len: int = 128
    """T: tokens per sequence (prompt + response + EOS must fit, see ``overlong``)."""
    batching: str = "pad"
    """``pad``: one record per row, EOS-padded to T (exact per-record loss and ids; trainers slice
    each batch to its widest row). ``pack``: records of one task concatenated into T-token rows
    (fewer rows; a record attends to the records before it in its row)."""
    overlong: str = "truncate_prompt"
    """A record longer than T: ``truncate_prompt`` drops the oldest prompt tokens (the response is
    never cut; a record whose response + EOS alone exceeds T - 1 is skipped), ``skip`` skips it.
    Both are counted."""
    default_task: str = "sft"
    """The task (domain) of records without a ``task`` field."""
    max_bad_fraction: float = 0.01
    """Stop with an error naming the worst file once more than this fraction of records are bad."""
    min_records_before_check: int = 1000
    """The bad fraction is enforced after this many records, and always at the end."""
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    """A longer line is a bad record (``oversized_record``)."""
    tokenize_batch_size: int = 256
    """Records per tokenizer call."""

    def __post_init__(self) -> None:
        if self.seq_len < 2:
            raise ValueError(f"sft.seq_len must be >= 2, got {self.seq_len}")
        if self.batching not in BATCHING:
            raise ValueError(f"sft.batching must be one of {list(BATCHING)}, got {self.batching!r}")
        if self.overlong not in OVERLONG_RULES:
            raise ValueError(f"sft.overlong must be one of {list(OVERLONG_RULES)}, got {self.overlong!r}")
        if not self.default_task:
            raise ValueError("sft.default_task must not be empty")
        if not 0.0 <= self.max_bad_fraction <= 1.0:
            raise ValueError(f"sft.max_bad_fraction must be in [0, 1], got {self.max_bad_fraction}")
        if self.tokenize_batch_size < 1:
            raise ValueError(f"sft.tokenize_batch_size must be >= 1, got {self.tokenize_batch_size}")
        if self.format not in SFT_FORMATS:
            raise ValueError(f"sft.format must be one of {list(SFT_FORMATS)}, got {self.format!r}")
        self.fields()  # a column or tag the format does not have is an error naming it

    def fields(self) -> SftFields:
        """The record layout with its field names resolved (what the readers take)."""
        return resolve_fields(self.format, self.columns, self.tags)


@dataclass(frozen=True)
class SftRecord:
    """One line of an SFT file: good (``messages`` ends with the response) or bad (``bad_reason``)."""

    messages: tuple[tuple[str, str], ...]
    task: str
    shard: str
    line: int
    difficulty: int | None = None
    bad_reason: str = ""
    detail: str = ""

    @property
    def is_bad(self) -> bool:
        return bool(self.bad_reason)

    @property
    def prompt(self) -> str:
        """The last prompt message's text (for ``{"prompt", "response"}`` records: the prompt)."""
        return self.messages[-2][1]

    @property
    def response(self) -> str:
        return self.messages[-1][1]

    @property
    def where(self) -> str:
        return f"{self.shard} line {self.line}"


def iter_sft_records(
    shard: Shard, default_task: str = "sft", max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    fields: SftFields | None = None,
) -> Iterator[SftRecord]:
    """One :class:`SftRecord` per non-blank line (per row) of ``shard``, good or bad, in file order.

    Args:
        shard: a JSONL or parquet/arrow file.
        default_task: the task of a record without one.
        max_record_bytes: a longer line is ``oversized_record``.
        fields: the record layout (``SftDataConfig.fields()``); default d3ray's own.
    """
    fields = fields or SftFields()
    if shard.columnar:
        yield from _columnar_records(shard, default_task, fields)
        return
    last_line = 0
    try:
        for line in iter_shard_lines(shard, max_record_bytes):
            line_no, data = line.number, line.data
            last_line = line_no
            if data is None:
                yield _bad(shard.name, line_no, "oversized_record", f"longer than {max_record_bytes} bytes")
            elif data and not data.isspace():
                yield parse_sft_line(data, shard.name, line_no, default_task, fields)
    except TruncatedStreamError as err:
        yield _bad(shard.name, last_line + 1, err.reason, err.detail)


def _columnar_records(shard: Shard, default_task: str, fields: SftFields) -> Iterator[SftRecord]:
    from d3ray.data.columnar import iter_column_batches

    for batch in iter_column_batches(shard, None):
        if batch.error or batch.table is None:
            yield _bad(shard.name, batch.first_row + 1, "corrupt_columnar", batch.error)
            continue
        for i, row in enumerate(batch.table.to_pylist()):
            present = {k: v for k, v in row.items() if v is not None}  # a table has every column: null = absent
            yield parse_sft_object(present, shard.name, batch.first_row + i + 1, default_task, fields)


def parse_sft_line(data: bytes | str, shard: str, line_no: int, default_task: str = "sft",
                   fields: SftFields | None = None) -> SftRecord:
    """Parse and validate one JSONL line into a good or bad :class:`SftRecord`."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError as err:
        return _bad(shard, line_no, "undecodable_bytes", str(err))
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as err:
        return _bad(shard, line_no, "malformed_json", str(err))
    if not isinstance(obj, dict):
        return _bad(shard, line_no, "malformed_json", f"a JSON {type(obj).__name__}, not an object")
    return parse_sft_object(obj, shard, line_no, default_task, fields)


def parse_sft_object(obj: dict[str, Any], shard: str, line_no: int, default_task: str = "sft",
                     fields: SftFields | None = None) -> SftRecord:
    """Validate one record (a parsed line or a row) into a good or bad :class:`SftRecord`."""
    fields = fields or SftFields()
    task_key, difficulty_key = fields.columns["task"], fields.columns["difficulty"]
    task = obj.get(task_key, default_task)
    if not isinstance(task, str) or not task.strip():
        return _bad(shard, line_no, "bad_task", f"field {task_key!r} is {task!r}")
    difficulty = obj.get(difficulty_key)
    if difficulty is not None and (not isinstance(difficulty, int) or isinstance(difficulty, bool)):
        return _bad(shard, line_no, "bad_task", f"field {difficulty_key!r} is {difficulty!r}, not an integer")
    messages, problem = record_messages(obj, fields)
    if problem:
        return _bad(shard, line_no, problem[0], problem[1], task)
    return SftRecord(messages=messages, task=task, shard=shard, line=line_no, difficulty=difficulty)


def _bad(shard: str, line_no: int, reason: str, detail: str, task: str = "") -> SftRecord:
    return SftRecord(messages=(), task=task, shard=shard, line=line_no, bad_reason=reason, detail=detail)


def render_messages(messages: tuple[tuple[str, str], ...], tokenizer: Any) -> tuple[str, str]:
    """(prompt text, response text) of a conversation whose last message is the response.

    Uses the tokenizer's chat template when it has one, else the plain template (module docstring).
    The response text does not include the EOS token; the tokenizing step appends it.

    Raises:
        ValueError: the chat template renders the prompt as something other than a prefix of the
            whole conversation (then no token boundary separates prompt from response).
    """
    prompt_msgs = [{"role": r, "content": c} for r, c in messages[:-1]]
    if getattr(tokenizer, "chat_template", None):
        prompt = tokenizer.apply_chat_template(prompt_msgs, tokenize=False, add_generation_prompt=True)
        full = tokenizer.apply_chat_template(
            [*prompt_msgs, {"role": "assistant", "content": messages[-1][1]}], tokenize=False
        )
        if not full.startswith(prompt):
            raise ValueError("the tokenizer's chat template does not render the prompt as a prefix of the conversation")
        return prompt, full[len(prompt) :]
    return plain_prompt(messages[:-1]), messages[-1][1]


def plain_prompt(messages: tuple[tuple[str, str], ...]) -> str:
    """The plain template's prompt: ``### {role}:\\n{content}\\n`` per message, then ``### assistant:\\n``."""
    return "".join(f"### {role}:\n{content}\n" for role, content in messages) + "### assistant:\n"


def render_record(record: SftRecord, tokenizer: Any) -> tuple[str, str]:
    """(prompt text, response text) of a good record; see :func:`render_messages`."""
    if record.is_bad:
        raise ValueError(f"{record.where}: cannot render a bad record ({record.bad_reason})")
    return render_messages(record.messages, tokenizer)
