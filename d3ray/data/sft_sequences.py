"""SFT records → T-token sequences with a per-token loss mask, ready for the chunker.

    SFT JSONL ──► iter_sft_records (validated; bad lines → BadRecordLedger with file and line)
      │ render_record: prompt text, response text (chat template or the plain template)
      │ tokenize: prompt ids | response ids + EOS            (one tokenizer call per batch of records)
      ▼ fit_example: T-token budget, the overlong rule (truncate the prompt's oldest tokens, or skip)
    pad:  one record per row  [p p p r r E | E E E]  loss_mask [0 0 0 1 1 1 | 0 0 0]  n_tokens 6
    pack: records of one task per row, each whole  [p r E p p r E | E]  (a record never spans rows)
      ▼
    PackedSequence(tokens (T,), domain = task, sample_id "<file>:<line>:0", n_tokens, loss_mask (T,))

``loss_mask[t]`` says whether token t is a target (the labels are built by
:func:`d3ray.data.labels.lm_labels`): the response tokens and the EOS after each response. The
stream is a pure function of the files, the tokenizer and the config (no Ray, no shuffling), so
re-streaming after a restart gives the same sequences with the same ids.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from d3ray.data.ledger import BadRecordLedger
from d3ray.data.packing import PackedSequence, make_sample_id
from d3ray.data.sft import SftDataConfig, SftRecord, iter_sft_records, render_record
from d3ray.data.sft_formats import SftFields
from d3ray.data.shards import list_shards

logger = logging.getLogger(__name__)


@dataclass
class SftStats:
    """What happened to the good records: kept whole, prompt-truncated, or skipped as too long."""

    records: int = 0
    truncated_prompt: int = 0
    skipped_overlong: int = 0
    sequences: int = 0
    target_tokens: int = 0

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def fit_example(
    prompt_ids: Sequence[int], response_ids: Sequence[int], seq_len: int, overlong: str
) -> tuple[np.ndarray, np.ndarray, str] | None:
    """One record's tokens and loss mask within ``seq_len`` tokens, by the overlong rule.

    Args:
        prompt_ids: the rendered prompt's tokens (at least one).
        response_ids: the response's tokens, EOS included.
        seq_len: T.
        overlong: ``truncate_prompt`` or ``skip`` (see :class:`~d3ray.data.sft.SftDataConfig`).

    Returns:
        ``(tokens (n,) int32, loss_mask (n,) bool, outcome)`` with n <= T and outcome ``kept`` or
        ``truncated_prompt``; None when the record is skipped.
    """
    n_p, n_r = len(prompt_ids), len(response_ids)
    if n_p < 1 or n_r < 1:
        raise ValueError(f"need at least one prompt and one response token, got {n_p} and {n_r}")
    outcome = "kept"
    if n_p + n_r > seq_len:
        if overlong == "skip" or n_r > seq_len - 1:
            return None
        prompt_ids = prompt_ids[n_p - (seq_len - n_r) :]  # keep the newest prompt tokens
        n_p = len(prompt_ids)
        outcome = "truncated_prompt"
    tokens = np.asarray([*prompt_ids, *response_ids], dtype=np.int32)
    mask = np.zeros(n_p + n_r, dtype=bool)
    mask[n_p:] = True
    return tokens, mask, outcome


def pad_sequence(
    tokens: np.ndarray, mask: np.ndarray, seq_len: int, eos_id: int, task: str, sample_id: str
) -> PackedSequence:
    """Right-pad one example (or a packed row) with EOS to T; padding gets no loss."""
    n = len(tokens)
    row = np.full(seq_len, eos_id, dtype=np.int32)
    row[:n] = tokens
    row_mask = np.zeros(seq_len, dtype=bool)
    row_mask[:n] = mask
    return PackedSequence(tokens=row, domain=task, sample_id=sample_id, n_tokens=n, loss_mask=row_mask)


class SftPacker:
    """Concatenates whole examples of one task into rows of at most T tokens (``batching: pack``)."""

    def __init__(self, seq_len: int, eos_id: int) -> None:
        self.seq_len = seq_len
        self.eos_id = eos_id
        self._rows: dict[str, tuple[list[np.ndarray], list[np.ndarray], str]] = {}

    def feed(self, tokens: np.ndarray, mask: np.ndarray, task: str, sample_id: str) -> list[PackedSequence]:
        """Add one example; return the row it closed (if it did not fit in its task's open row)."""
        out = []
        parts, masks, head = self._rows.get(task, ([], [], sample_id))
        if parts and sum(len(p) for p in parts) + len(tokens) > self.seq_len:
            out.append(self._emit(task, parts, masks, head))
            parts, masks, head = [], [], sample_id
        parts.append(tokens)
        masks.append(mask)
        self._rows[task] = (parts, masks, head)
        return out

    def flush(self) -> list[PackedSequence]:
        """Emit every open row (tasks sorted), EOS-padded."""
        out = [self._emit(task, *self._rows[task]) for task in sorted(self._rows) if self._rows[task][0]]
        self._rows.clear()
        return out

    def _emit(self, task: str, parts: list[np.ndarray], masks: list[np.ndarray], head: str) -> PackedSequence:
        return pad_sequence(np.concatenate(parts), np.concatenate(masks), self.seq_len, self.eos_id, task, head)


def iter_sft_sequences(
    cfg: SftDataConfig, tokenizer: Any, ledger: BadRecordLedger, stats: SftStats | None = None,
    task: str | None = None,
) -> Iterator[PackedSequence]:
    """The SFT training stream: one epoch of sequences with loss masks, in file and line order.

    Args:
        cfg: files, T, batching, overlong rule, bad-record limits.
        tokenizer: a ``PreTrainedTokenizerFast`` or a local tokenizer directory.
        ledger: counts good and bad records per file (bad ones with their first line numbers), every
            record of the files, whatever ``task``.
        stats: receives the truncated/skipped counts (of ``task``'s records only, when given), if given.
        task: only this task's sequences (a mixer's per-task lane): the others' records are read and
            counted but neither rendered nor tokenized. Packing is per task, so these are exactly the
            sequences of ``task`` in the whole stream, in the same order.

    Raises:
        BadRecordFractionError: more than ``cfg.max_bad_fraction`` of the records are bad (checked
            after ``cfg.min_records_before_check`` records and at the end); names the worst file.
    """
    if isinstance(tokenizer, str | Path):
        from d3ray.data.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(tokenizer)
    stats = stats if stats is not None else SftStats()
    eos_id = int(tokenizer.eos_token_id)
    packer = SftPacker(cfg.seq_len, eos_id) if cfg.batching == "pack" else None
    for batch in _good_record_batches(cfg, ledger, task):
        rendered = [render_record(r, tokenizer) for r in batch]
        prompts = tokenizer([p for p, _ in rendered], add_special_tokens=False)["input_ids"]
        responses = tokenizer([r for _, r in rendered], add_special_tokens=False)["input_ids"]
        for record, p_ids, r_ids in zip(batch, prompts, responses, strict=True):
            stats.records += 1
            if not r_ids or r_ids[-1] != eos_id:  # a chat template may already end the turn with EOS
                r_ids = [*r_ids, eos_id]
            fitted = fit_example(p_ids, r_ids, cfg.seq_len, cfg.overlong)
            if fitted is None:
                stats.skipped_overlong += 1
                logger.debug("%s: skipped, %d prompt + %d response tokens > T=%d",
                             record.where, len(p_ids), len(r_ids), cfg.seq_len)
                continue
            tokens, mask, outcome = fitted
            stats.truncated_prompt += outcome == "truncated_prompt"
            stats.target_tokens += int(mask.sum())
            sample_id = make_sample_id(record.shard, record.line, 0)
            if packer is None:
                out = [pad_sequence(tokens, mask, cfg.seq_len, eos_id, record.task, sample_id)]
            else:
                out = packer.feed(tokens, mask, record.task, sample_id)
            stats.sequences += len(out)
            yield from out
    if packer is not None:
        tail = packer.flush()
        stats.sequences += len(tail)
        yield from tail
    ledger.check(cfg.max_bad_fraction, "sft.max_bad_fraction")
    if stats.truncated_prompt or stats.skipped_overlong:
        logger.warning("SFT records longer than T=%d: %d prompt-truncated, %d skipped (of %d)",
                       cfg.seq_len, stats.truncated_prompt, stats.skipped_overlong, stats.records)


def _good_record_batches(cfg: SftDataConfig, ledger: BadRecordLedger,
                         task: str | None = None) -> Iterator[list[SftRecord]]:
    if not cfg.paths:
        raise ValueError("sft.paths is empty: give SFT JSONL files or folders")
    batch: list[SftRecord] = []
    fields = cfg.fields()
    for shard in list_shards(cfg.paths):
        for record in iter_sft_records(shard, cfg.default_task, cfg.max_record_bytes, fields):
            if record.is_bad:
                ledger.record_bad(record.shard, record.line, record.bad_reason, record.detail)
            else:
                ledger.record_good(record.shard)
                if task is None or record.task == task:
                    batch.append(record)
            if ledger.total >= cfg.min_records_before_check:
                ledger.check(cfg.max_bad_fraction, "sft.max_bad_fraction")
            if len(batch) >= cfg.tokenize_batch_size:
                yield batch
                batch = []
    if batch:
        yield batch


def sft_task_counts(cfg: SftDataConfig) -> dict[str, int]:
    """Good records per task of ``cfg.paths`` (a full read, no tokenizing), tasks sorted: the domains a
    mixer can mix in SFT, and the lanes of the SFT stream (:class:`~d3ray.data.iterable_source.IterableSource`)."""
    if not cfg.paths:
        raise ValueError("sft.paths is empty: give SFT JSONL files or folders")
    counts: dict[str, int] = {}
    fields = cfg.fields()
    for shard in list_shards(cfg.paths):
        for record in iter_sft_records(shard, cfg.default_task, cfg.max_record_bytes, fields):
            if not record.is_bad:
                counts[record.task] = counts.get(record.task, 0) + 1
    return dict(sorted(counts.items()))


def read_sft_records(paths: Sequence[str], default_task: str = "sft",
                     fields: SftFields | None = None) -> list[SftRecord]:
    """Every good record of ``paths``, in order; the first bad one raises ``ValueError`` naming its
    file, line and field (for evaluation sets, where a skipped record would change the metric)."""
    out = []
    for shard in list_shards(list(paths)):
        for record in iter_sft_records(shard, default_task, fields=fields):
            if record.is_bad:
                raise ValueError(f"{record.where}: {record.bad_reason}: {record.detail}")
            out.append(record)
    if not out:
        raise ValueError(f"no SFT records in {list(paths)}")
    return out


def check_sft_sample(cfg: SftDataConfig, field: str = "sft.paths", per_file: int = 64, max_files: int = 8) -> None:
    """Stop before any Ray work when the first records of a few SFT files hold no usable record.

    Raises:
        UserError: a path that matches nothing (naming ``field``), or no good record among the first
            ``per_file`` of up to ``max_files`` files: the message names ``sft.format`` / ``sft.columns``
            when the format's fields are missing, else the reasons and the first bad record.
    """
    from d3ray.data.shards import list_corpus
    from d3ray.errors import DataPathError, UserError

    try:
        listing = list_corpus(list(cfg.paths))
    except DataPathError as err:
        raise DataPathError(f"{field}: {err}") from None
    if listing.ignored:
        logger.warning(listing.ignored_line(field))
    shards = listing.shards
    n_used = min(len(shards), max_files)
    picked = [shards[(i * len(shards)) // n_used] for i in range(n_used)]
    reasons: dict[str, int] = {}
    first: SftRecord | None = None
    fields = cfg.fields()
    for shard in picked:
        for n, record in enumerate(iter_sft_records(shard, cfg.default_task, cfg.max_record_bytes, fields)):
            if not record.is_bad:
                return
            reasons[record.bad_reason] = reasons.get(record.bad_reason, 0) + 1
            first = first or record
            if n + 1 >= per_file:
                break
    if first is None:
        raise UserError(f"{field}: the {n_used} files sampled hold no record (only blank lines); check the paths")
    where = f"the first {sum(reasons.values())} records of {n_used} file(s) of {field}"
    if set(reasons) == {"missing_prompt"}:
        raise UserError(f"sft.format: none of {where} has the fields of sft.format={cfg.format} (first: {first.where}, "
                        f"{first.detail}); set --sft.format (d3ray, alpaca, sharegpt) or --sft.columns.<field>=<key>")
    raise UserError(f"{field}: none of {where} is usable (by reason {dict(sorted(reasons.items()))}; first "
                    f"{first.where}: {first.bad_reason}, {first.detail}); fix the records, or check sft.format / "
                    f"sft.columns / sft.tags")
