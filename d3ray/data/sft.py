"""SFT records: read and validate JSONL, render prompt and response text with the tokenizer's template.

Two record shapes are accepted, one per line of a ``.jsonl[.zst|.gz]`` file:

    {"prompt": "3+5=", "response": "8", "task": "add1", "difficulty": 1}
    {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...], "task": "chat"}

``task`` (the domain of the SFT stream: what mixers, curricula and per-task metrics key on)
defaults to ``SftDataConfig.default_task``; ``difficulty`` is optional. For ``messages`` the last
message is the response and must come from the assistant; the earlier ones are the prompt
(earlier assistant turns are context and get no loss).

Every non-blank line becomes a good :class:`SftRecord` or a bad one whose ``bad_reason`` (one of
:data:`SFT_BAD_REASONS`) and ``detail`` say what is wrong, with the file and 1-based line, to be
counted by :class:`~d3ray.data.records.BadRecordLedger` exactly like bad pre-training lines.

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
from d3ray.data.shards import Shard, TruncatedStreamError, iter_shard_lines

SFT_BAD_REASONS = (
    "malformed_json",  # not JSON, or JSON that is not an object
    "undecodable_bytes",  # not UTF-8
    "oversized_record",  # longer than max_record_bytes
    "truncated_zstd",  # the .zst stream ends inside a frame
    "truncated_gzip",  # the .gz stream ends early
    "missing_prompt",  # neither "prompt" nor "messages"
    "non_string_prompt",  # "prompt" is not a string
    "empty_prompt",  # the prompt is empty or whitespace only
    "missing_response",  # "prompt" without "response"
    "non_string_response",  # "response" is not a string
    "empty_response",  # the response is empty or whitespace only
    "bad_messages",  # "messages" is not a list of {role, content} ending with the assistant
    "bad_task",  # "task" is not a non-empty string, or "difficulty" not an integer
)
ROLES = ("system", "user", "assistant")
OVERLONG_RULES = ("truncate_prompt", "skip")
BATCHING = ("pad", "pack")


@dataclass(frozen=True, kw_only=True)
class SftDataConfig:
    """How SFT records become training sequences."""

    paths: list[str] = field(default_factory=list)
    """SFT JSONL files or folders of them (.jsonl, .jsonl.zst, .jsonl.gz)."""
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
    shard: Shard, default_task: str = "sft", max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
) -> Iterator[SftRecord]:
    """One :class:`SftRecord` per non-blank line of ``shard``, good or bad, in file order."""
    last_line = 0
    try:
        for line in iter_shard_lines(shard, max_record_bytes):
            line_no, data = line.number, line.data
            last_line = line_no
            if data is None:
                yield _bad(shard.name, line_no, "oversized_record", f"longer than {max_record_bytes} bytes")
            elif data and not data.isspace():
                yield parse_sft_line(data, shard.name, line_no, default_task)
    except TruncatedStreamError as err:
        yield _bad(shard.name, last_line + 1, err.reason, err.detail)


def parse_sft_line(data: bytes | str, shard: str, line_no: int, default_task: str = "sft") -> SftRecord:
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
    task = obj.get("task", default_task)
    if not isinstance(task, str) or not task.strip():
        return _bad(shard, line_no, "bad_task", f"field 'task' is {task!r}")
    difficulty = obj.get("difficulty")
    if difficulty is not None and (not isinstance(difficulty, int) or isinstance(difficulty, bool)):
        return _bad(shard, line_no, "bad_task", f"field 'difficulty' is {difficulty!r}, not an integer")
    if "messages" in obj:
        messages, problem = _validate_messages(obj["messages"])
        if problem:
            return _bad(shard, line_no, problem[0], problem[1], task)
    else:
        reason = _prompt_response_problem(obj)
        if reason:
            return _bad(shard, line_no, reason[0], reason[1], task)
        messages = (("user", obj["prompt"]), ("assistant", obj["response"]))
    return SftRecord(messages=messages, task=task, shard=shard, line=line_no, difficulty=difficulty)


def _prompt_response_problem(obj: dict[str, Any]) -> tuple[str, str] | None:
    if "prompt" not in obj:
        return "missing_prompt", f"no field 'prompt' or 'messages'; keys: {sorted(obj)[:8]}"
    if not isinstance(obj["prompt"], str):
        return "non_string_prompt", f"field 'prompt' is a {type(obj['prompt']).__name__}"
    if not obj["prompt"].strip():
        return "empty_prompt", f"field 'prompt' is {obj['prompt'][:20]!r}"
    if "response" not in obj:
        return "missing_response", f"no field 'response'; keys: {sorted(obj)[:8]}"
    if not isinstance(obj["response"], str):
        return "non_string_response", f"field 'response' is a {type(obj['response']).__name__}"
    if not obj["response"].strip():
        return "empty_response", f"field 'response' is {obj['response'][:20]!r}"
    return None


def _validate_messages(raw: Any) -> tuple[tuple[tuple[str, str], ...], tuple[str, str] | None]:
    if not isinstance(raw, list) or len(raw) < 2:
        return (), ("bad_messages", "field 'messages' must be a list of at least 2 messages")
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            return (), ("bad_messages", f"messages[{i}] must be {{role: {'|'.join(ROLES)}, content: string}}")
        out.append((m["role"], m["content"]))
    if out[-1][0] != "assistant":
        return (), ("bad_messages", f"the last message is from {out[-1][0]!r}, not the assistant")
    if not out[-1][1].strip():
        return (), ("empty_response", "the last (assistant) message is empty")
    if not any(content.strip() for _, content in out[:-1]):
        return (), ("empty_prompt", "every message before the response is empty")
    return tuple(out), None


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
