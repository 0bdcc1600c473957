"""SFT record layouts (d3ray, Alpaca, ShareGPT) and the column mapping that reads them.

One record (a JSONL line, or a parquet/arrow row) becomes a conversation: ``(role, content)``
messages ending with the assistant's response. The layouts and their fields, named as in
LLaMA-Factory's ``dataset_info.json`` (``formatting``, ``columns``, ``tags``):

    d3ray     {"prompt", "response", "task", "difficulty"}   or   {"messages": [{"role", "content"}], "task"}
    alpaca    {"instruction", "input", "output", "system", "history": [[user, assistant], ...]}
              the user turn is instruction + "\\n" + input (input optional)
    sharegpt  {"conversations": [{"from": "human"|"gpt"|"system", "value"}], "system"}

``sft.columns`` renames any field of the chosen layout (``--sft.columns.prompt=question``); ``sft.tags``
renames ShareGPT's message keys and roles (``from`` / ``value`` / ``human`` / ``gpt`` / ``system``), so
OpenAI-style ``{"role": "user", "content"}`` messages are ``--sft.tags.role_tag=role
--sft.tags.content_tag=content --sft.tags.user_tag=user --sft.tags.assistant_tag=assistant``. Every
layout reads ``task`` (the SFT stream's domain) and ``difficulty`` when a record has them. Tool turns
(ShareGPT's ``observation`` / ``function_call``) are not supported: such a record is bad
(``bad_messages``), counted, never silently cut.

:func:`record_messages` is pure: a dict in, messages or a bad reason out.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

SFT_FORMATS = ("d3ray", "alpaca", "sharegpt")
ROLES = ("system", "user", "assistant")

#: The record fields of each layout, by their LLaMA-Factory ``columns`` name (absent: not in that layout).
FORMAT_COLUMNS: dict[str, dict[str, str]] = {
    "d3ray": {"prompt": "prompt", "response": "response", "messages": "messages", "task": "task",
              "difficulty": "difficulty"},
    "alpaca": {"prompt": "instruction", "query": "input", "response": "output", "system": "system",
               "history": "history", "task": "task", "difficulty": "difficulty"},
    "sharegpt": {"messages": "conversations", "system": "system", "task": "task", "difficulty": "difficulty"},
}
#: The message keys and role names of each layout's message lists.
FORMAT_TAGS: dict[str, dict[str, str]] = {
    "d3ray": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant",
              "system_tag": "system"},
    "sharegpt": {"role_tag": "from", "content_tag": "value", "user_tag": "human", "assistant_tag": "gpt",
                 "system_tag": "system"},
}


@dataclass(frozen=True, kw_only=True)
class SftColumns:
    """Record field names (LLaMA-Factory ``columns``); unset = the ``sft.format``'s own name."""

    prompt: str | None = None
    """The user's instruction (d3ray ``prompt``, alpaca ``instruction``)."""
    query: str | None = None
    """Alpaca: extra input appended to the instruction after a newline (``input``)."""
    response: str | None = None
    """The response (d3ray ``response``, alpaca ``output``)."""
    system: str | None = None
    """A system prompt, when a record has one (alpaca, sharegpt: ``system``)."""
    history: str | None = None
    """Alpaca: earlier ``[user, assistant]`` turns (``history``), context without loss."""
    messages: str | None = None
    """The message list (d3ray ``messages``, sharegpt ``conversations``)."""
    task: str | None = None
    """The task (the SFT domain), when a record has one (``task``; else ``sft.default_task``)."""
    difficulty: str | None = None
    """An integer difficulty, when a record has one (``difficulty``; curricula read it)."""


@dataclass(frozen=True, kw_only=True)
class SftTags:
    """Message keys and role names of a message list (LLaMA-Factory ``tags``); unset = the format's own."""

    role_tag: str | None = None
    """The key naming a message's sender (sharegpt ``from``, d3ray ``role``)."""
    content_tag: str | None = None
    """The key holding a message's text (sharegpt ``value``, d3ray ``content``)."""
    user_tag: str | None = None
    """The sender name of user messages (sharegpt ``human``, d3ray ``user``)."""
    assistant_tag: str | None = None
    """The sender name of assistant messages (sharegpt ``gpt``, d3ray ``assistant``)."""
    system_tag: str | None = None
    """The sender name of system messages (``system``)."""


@dataclass(frozen=True)
class SftFields:
    """A layout with its field names resolved: what :func:`record_messages` reads. Plain and picklable."""

    format: str = "d3ray"
    columns: dict[str, str] = field(default_factory=lambda: dict(FORMAT_COLUMNS["d3ray"]))
    tags: dict[str, str] = field(default_factory=lambda: dict(FORMAT_TAGS["d3ray"]))

    def describe(self) -> dict[str, Any]:
        """The layout and its names (what a tokenizer trained on the records depends on)."""
        return {"format": self.format, "columns": dict(sorted(self.columns.items())),
                "tags": dict(sorted(self.tags.items()))}


def resolve_fields(fmt: str, columns: SftColumns | None = None, tags: SftTags | None = None) -> SftFields:
    """The fields of ``fmt`` with ``columns`` / ``tags`` overriding its names.

    Raises:
        ValueError: an unknown format, or a column or tag the format does not have (naming the field).
    """
    if fmt not in SFT_FORMATS:
        raise ValueError(f"sft.format must be one of {list(SFT_FORMATS)}, got {fmt!r}")
    cols = dict(FORMAT_COLUMNS[fmt])
    for f in fields(SftColumns):
        value = getattr(columns, f.name) if columns is not None else None
        if value is None:
            continue
        if f.name not in cols:
            raise ValueError(f"sft.columns.{f.name} does not apply to sft.format={fmt} (its columns: {sorted(cols)})")
        if not value:
            raise ValueError(f"sft.columns.{f.name} must be a field name, got {value!r}")
        cols[f.name] = value
    tag_names = dict(FORMAT_TAGS.get(fmt, {}))
    for f in fields(SftTags):
        value = getattr(tags, f.name) if tags is not None else None
        if value is None:
            continue
        if not tag_names:
            raise ValueError(f"sft.tags.{f.name} applies to message lists (sft.format=sharegpt or d3ray), not {fmt}")
        if not value:
            raise ValueError(f"sft.tags.{f.name} must be a name, got {value!r}")
        tag_names[f.name] = value
    return SftFields(fmt, cols, tag_names)


Messages = tuple[tuple[str, str], ...]
Problem = tuple[str, str]  # (bad reason, detail)


def record_messages(obj: dict[str, Any], f: SftFields) -> tuple[Messages, Problem | None]:
    """The conversation of one record (last message: the assistant's response), or ``((), (reason, detail))``."""
    c = f.columns
    system, problem = _optional_text(obj, c.get("system"))
    if problem:
        return (), problem
    head: Messages = (("system", system),) if system else ()
    if f.format == "sharegpt" or (f.format == "d3ray" and c["messages"] in obj):
        if c["messages"] not in obj:
            return (), ("missing_prompt", f"no field {c['messages']!r}; keys: {sorted(obj)[:8]}{_hint(obj)}")
        messages, problem = _message_list(obj[c["messages"]], c["messages"], f.tags)
        return (head + messages, None) if not problem else ((), problem)
    problem = _prompt_response_problem(obj, c)
    if problem:
        return (), problem
    prompt = obj[c["prompt"]]
    if f.format == "alpaca":
        query, problem = _optional_text(obj, c["query"])
        if problem:
            return (), problem
        prompt = "\n".join(p for p in (prompt, query) if p)
        history, problem = _history(obj.get(c["history"]), c["history"])
        if problem:
            return (), problem
        head += history
    if not prompt.strip():
        return (), ("empty_prompt", f"field {c['prompt']!r} is {obj[c['prompt']][:20]!r}")
    return (*head, ("user", prompt), ("assistant", obj[c["response"]])), None


def _hint(obj: dict[str, Any]) -> str:
    """A hint at the layout a record's keys look like (for the message of a record read in another)."""
    for fmt in ("alpaca", "sharegpt", "d3ray"):
        cols = FORMAT_COLUMNS[fmt]
        needed = [cols["messages"]] if fmt == "sharegpt" else [cols["prompt"], cols["response"]]
        if all(k in obj for k in needed):
            return f" ({'an' if fmt == 'alpaca' else 'a'} {fmt} record? --sft.format={fmt})"
    return " (--sft.columns.<field>=<key> maps other names)"


def _optional_text(obj: dict[str, Any], key: str | None) -> tuple[str, Problem | None]:
    value = obj.get(key) if key is not None else None
    if value is None:
        return "", None
    if not isinstance(value, str):
        return "", ("non_string_prompt", f"field {key!r} is a {type(value).__name__}")
    return value, None


def _prompt_response_problem(obj: dict[str, Any], c: dict[str, str]) -> Problem | None:
    prompt, response = c["prompt"], c["response"]
    if prompt not in obj:
        alt = f" or {c['messages']!r}" if "messages" in c else ""
        return "missing_prompt", f"no field {prompt!r}{alt}; keys: {sorted(obj)[:8]}{_hint(obj)}"
    if not isinstance(obj[prompt], str):
        return "non_string_prompt", f"field {prompt!r} is a {type(obj[prompt]).__name__}"
    if "query" not in c and not obj[prompt].strip():  # alpaca: checked once the input is appended
        return "empty_prompt", f"field {prompt!r} is {obj[prompt][:20]!r}"
    if response not in obj:
        return "missing_response", f"no field {response!r}; keys: {sorted(obj)[:8]}"
    if not isinstance(obj[response], str):
        return "non_string_response", f"field {response!r} is a {type(obj[response]).__name__}"
    if not obj[response].strip():
        return "empty_response", f"field {response!r} is {obj[response][:20]!r}"
    return None


def _history(raw: Any, key: str) -> tuple[Messages, Problem | None]:
    if raw is None:
        return (), None
    out: list[tuple[str, str]] = []
    if not isinstance(raw, list):
        return (), ("bad_messages", f"field {key!r} must be a list of [user, assistant] pairs")
    for i, pair in enumerate(raw):
        if not (isinstance(pair, list | tuple) and len(pair) == 2 and all(isinstance(t, str) for t in pair)):
            return (), ("bad_messages", f"{key}[{i}] must be a [user, assistant] pair of strings")
        out += [("user", pair[0]), ("assistant", pair[1])]
    return tuple(out), None


def _message_list(raw: Any, key: str, tags: dict[str, str]) -> tuple[Messages, Problem | None]:
    role_tag, content_tag = tags["role_tag"], tags["content_tag"]
    roles = {tags["system_tag"]: "system", tags["user_tag"]: "user", tags["assistant_tag"]: "assistant"}
    if not isinstance(raw, list) or len(raw) < 2:
        return (), ("bad_messages", f"field {key!r} must be a list of at least 2 messages")
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or not isinstance(m.get(content_tag), str):
            return (), ("bad_messages", f"{key}[{i}] must be {{{role_tag}: {'|'.join(roles)}, {content_tag}: string}}")
        role = roles.get(m.get(role_tag))  # type: ignore[arg-type]
        if role is None:
            return (), ("bad_messages", f"{key}[{i}] has {role_tag} {m.get(role_tag)!r}, not one of {list(roles)} "
                                        f"(tool turns are not supported; sft.tags.* renames the roles)")
        out.append((role, m[content_tag]))
    if out[-1][0] != "assistant":
        return (), ("bad_messages", f"the last message is from {out[-1][0]!r}, not the assistant")
    if not out[-1][1].strip():
        return (), ("empty_response", "the last (assistant) message is empty")
    if not any(content.strip() for _, content in out[:-1]):
        return (), ("empty_prompt", "every message before the response is empty")
    return tuple(out), None
