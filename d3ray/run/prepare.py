"""What a run needs before Ray starts: its data, tokenizer, model vocabulary, eval sets and eval tasks.

    pre-training:  data.train_paths (or the generated sample corpus) → shards → tokenizer trained on them
    SFT (sft:)     sft.paths (or the generated skill suite) → records → tokenizer trained on their text
                   (digits split), eval sets of held-out records with response-only loss masks

Everything here runs in the driver before Ray starts, so that a wrong path, a bad file, a corpus whose
records are all of unknown domains or a bad task spec is reported at once (``d3ray.errors``). The
tokenizer is trained once per run directory (never into ``data.tokenizer.path``, which is only read)
and reused as it is on every resume whose data and tokenizer config are unchanged. A pretrained model
(``model.pretrained_path``) brings its tokenizer (unless ``data.tokenizer.path`` names one), and a
tokenizer larger than its vocabulary is refused, naming both sizes.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from d3ray.config import RunConfig
from d3ray.data.config import DataConfig
from d3ray.data.sft import SftDataConfig
from d3ray.errors import UserError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PreparedData:
    """The run's resolved data: shards or SFT files, tokenizer, model vocabulary, eval task spec."""

    data: DataConfig
    train_shards: list[Any]
    validation_shards: list[Any]
    tokenizer_dir: Path
    vocab_size: int
    eos_id: int
    sft: SftDataConfig | None = None
    """The SFT records (paths resolved) when the run fine-tunes on them."""
    sft_eval_paths: list[str] = dataclasses.field(default_factory=list)
    """Held-out SFT files: the per-task eval sets (response loss)."""
    eval_tasks: str = ""
    """``eval.tasks`` with the generated suite's path filled in."""
    domains_line: str = ""
    """Pre-training: the line saying the corpus' domains and where they come from (printed by the run)."""


def prepare_data(cfg: RunConfig) -> PreparedData:
    """Resolve the training data (generating it if none is configured) and the tokenizer."""
    if cfg.sft is not None:
        return _prepare_sft(cfg)
    from d3ray.data.corpus import prepare_corpus
    from d3ray.data.sample import write_sample_corpus
    from d3ray.data.tokenizer import ensure_tokenizer, load_tokenizer

    data = model_tokenizer(cfg)
    if not data.train_paths:
        sample_dir = cfg.run_dir / "sample_data"
        if not (sample_dir / "train").exists():
            logger.info("no data.train_paths configured: generating the sample corpus in %s", sample_dir)
            write_sample_corpus(sample_dir, seed=cfg.seed)
        data = dataclasses.replace(
            data,
            train_paths=[str(sample_dir / "train")],
            validation_paths=list(data.validation_paths) or [str(sample_dir / "validation")],
        )
    # shards listed, data.domains resolved, a sample of records checked: before a tokenizer is trained on them
    corpus = prepare_corpus(data)
    data, train_shards, validation_shards = corpus.data, corpus.train, corpus.validation
    tokenizer_dir = Path(ensure_tokenizer(data, train_shards, cfg.run_dir))
    tokenizer = load_tokenizer(tokenizer_dir)
    check_model_vocab(cfg, len(tokenizer))
    return PreparedData(data, train_shards, validation_shards, tokenizer_dir, len(tokenizer),
                        tokenizer.eos_token_id, eval_tasks=cfg.eval.tasks, domains_line=corpus.domains_line)


def _prepare_sft(cfg: RunConfig) -> PreparedData:
    """SFT: the records (or the generated skill suite), and a tokenizer trained on their text."""
    from d3ray.data.sft_sequences import check_sft_sample, read_sft_records
    from d3ray.data.skills import write_sft_suite
    from d3ray.data.tokenizer import (
        TOKENIZER_SUBDIR,
        check_user_tokenizer,
        ensure_run_tokenizer,
        load_tokenizer,
        sft_tokenizer_source,
        train_tokenizer_from_texts,
    )

    sft = cfg.sft
    assert sft is not None
    # The user's tokenizer (or the pretrained model's): loaded or refused (before any file is generated),
    # never written to.
    tokenizer_path = model_tokenizer(cfg).tokenizer.path
    user_tokenizer = check_user_tokenizer(tokenizer_path) if tokenizer_path else None
    suite = cfg.run_dir / "sft_data"
    eval_paths = list(cfg.eval.sft_paths)
    if not sft.paths:
        if not (suite / "manifest.json").exists():
            logger.info("no sft.paths configured: generating the skill suite in %s", suite)
            write_sft_suite(suite, seed=cfg.seed)
        sft = dataclasses.replace(sft, paths=[str(suite / "train")])
        eval_paths = eval_paths or [str(suite / "test")]
    check_sft_sample(sft)  # a path or a layout (sft.format, sft.columns) the records do not fit: one line now
    if user_tokenizer is not None:
        tokenizer_dir = user_tokenizer
    else:
        tcfg = dataclasses.replace(cfg.data.tokenizer, split_digits=True)

        def train() -> Path:
            try:
                records = read_sft_records(sft.paths, sft.default_task, sft.fields())
            except ValueError as err:  # a bad or missing record: the user's data, one line
                raise UserError(f"sft.paths: {err}; fix the records (the tokenizer is trained on them)") from err
            texts = ["\n".join(text for _, text in r.messages) for r in records]
            return train_tokenizer_from_texts(texts, tcfg, cfg.run_dir / TOKENIZER_SUBDIR, trained_from)

        trained_from = sft_tokenizer_source(sft.paths, sft.default_task, tcfg, cfg.run_dir, sft.fields().describe())
        tokenizer_dir = ensure_run_tokenizer(cfg.run_dir, trained_from, train)
    tokenizer = load_tokenizer(tokenizer_dir)
    check_model_vocab(cfg, len(tokenizer))
    tasks = cfg.eval.tasks.replace("{suite}", str(suite))
    return PreparedData(cfg.data, [], [], tokenizer_dir, len(tokenizer), tokenizer.eos_token_id, sft=sft,
                        sft_eval_paths=eval_paths, eval_tasks=tasks)


def model_tokenizer(cfg: RunConfig) -> DataConfig:
    """``cfg.data`` with the tokenizer a pretrained model brings: with ``model.pretrained_path`` set and
    ``data.tokenizer.path`` unset, the tokenizer files of the model directory (read only; a directory
    without them is refused: a tokenizer trained on the corpus would not match the model's embedding).

    Raises:
        UserError: ``model.pretrained_path`` is not a model directory, or holds no loadable tokenizer.
    """
    from d3ray.data.tokenizer import check_user_tokenizer
    from d3ray.model import check_pretrained_path

    model_dir = cfg.model.pretrained_path
    if model_dir is None or cfg.data.tokenizer.path is not None:
        check_pretrained_path(cfg.model)
        return cfg.data
    check_pretrained_path(cfg.model)
    if not any((Path(model_dir) / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        raise UserError(f"model.pretrained_path={model_dir}: holds no tokenizer (tokenizer.json), and the model "
                        "needs its own: set data.tokenizer.path to the model's tokenizer directory")
    check_user_tokenizer(model_dir, field="model.pretrained_path")
    return dataclasses.replace(cfg.data, tokenizer=dataclasses.replace(cfg.data.tokenizer, path=model_dir))


def check_model_vocab(cfg: RunConfig, tokenizer_size: int) -> None:
    """A pretrained model has an embedding row for every token of the run's tokenizer, else one line
    naming both sizes (:func:`d3ray.model.check_tokenizer_fits`)."""
    if cfg.model.pretrained_path is None:
        return
    from d3ray.model import check_tokenizer_fits, model_config_dict

    config = model_config_dict(cfg.model, tokenizer_size, cfg.data.seq_len, 0)
    path = cfg.data.tokenizer.path or cfg.model.pretrained_path
    field = "data.tokenizer.path" if cfg.data.tokenizer.path else "model.pretrained_path (its tokenizer)"
    check_tokenizer_fits(config, tokenizer_size, cfg.model, field, path)


def load_eval_sets(cfg: RunConfig, prepared: PreparedData) -> dict[str, Any]:
    """Held-out sets by name: per-domain validation sequences and ``ood:<file>`` text as (n, T) int32
    arrays (pre-training), or per-task held-out SFT records as ``{input_ids, n_tokens, loss_mask}``."""
    from d3ray.data.evaluation import load_eval_sequences, load_text_file_sequences

    sets: dict[str, Any] = {}
    if prepared.sft is not None:
        sets.update(_sft_eval_sets(prepared, cfg.eval.max_sequences_per_domain))
    elif prepared.data.validation_paths:
        sets.update(load_eval_sequences(prepared.validation_shards, prepared.data, prepared.tokenizer_dir,
                                        cfg.eval.max_sequences_per_domain))
    for path in cfg.eval.ood_text_paths:
        name = f"ood:{Path(path).stem}"
        sets[name] = load_text_file_sequences(path, prepared.tokenizer_dir, prepared.data.seq_len,
                                              cfg.eval.max_ood_sequences)
    return sets


def _sft_eval_sets(prepared: PreparedData, per_task: int) -> dict[str, dict[str, Any]]:
    if not prepared.sft_eval_paths:
        return {}
    return sft_eval_sets(prepared.sft, prepared.sft_eval_paths, prepared.tokenizer_dir, per_task)


def sft_eval_sets(sft: SftDataConfig, paths: list[str], tokenizer: Any, per_task: int) -> dict[str, dict[str, Any]]:
    """Per-task held-out SFT sets: the first ``per_task`` records of each task of ``paths``, one per row.

    Returns:
        task → ``{input_ids (n, T) int32, n_tokens (n,) int32, loss_mask (n, T) bool, prompts (n,) str,
        references (n,) str}``: the rendered rows (the responses are the loss targets) and, next to them,
        each row's raw last prompt message and reference response (``SftRecord.prompt`` / ``.response``),
        which a reward such as :func:`d3ray.data.skills.exact_match` reads (the NICE selector).
    """
    import numpy as np

    from d3ray.data.ledger import BadRecordLedger
    from d3ray.data.packing import make_sample_id
    from d3ray.data.sft import iter_sft_records
    from d3ray.data.sft_sequences import iter_sft_sequences
    from d3ray.data.shards import list_shards

    held_out = dataclasses.replace(sft, paths=list(paths), batching="pad")
    by_task: dict[str, list[Any]] = {}
    for seq in iter_sft_sequences(held_out, tokenizer, BadRecordLedger()):
        rows = by_task.setdefault(seq.domain, [])
        if len(rows) < per_task:
            rows.append(seq)
    wanted = {s.sample_id for rows in by_task.values() for s in rows}
    texts = {}  # sample id → (prompt, reference) of the records kept above (one record per row: ``pad``)
    for shard in list_shards(held_out.paths):
        for record in iter_sft_records(shard, held_out.default_task, held_out.max_record_bytes, held_out.fields()):
            sample_id = make_sample_id(record.shard, record.line, 0)
            if not record.is_bad and sample_id in wanted:
                texts[sample_id] = (record.prompt, record.response)
    return {task: {"input_ids": np.stack([s.tokens for s in rows]).astype(np.int32),
                   "n_tokens": np.asarray([s.n_tokens for s in rows], dtype=np.int32),
                   "loss_mask": np.stack([s.loss_mask for s in rows]),
                   "prompts": np.asarray([texts[s.sample_id][0] for s in rows], dtype=np.str_),
                   "references": np.asarray([texts[s.sample_id][1] for s in rows], dtype=np.str_)}
            for task, rows in sorted(by_task.items())}


def prepare_eval_tasks(prepared: PreparedData) -> list[Any]:
    """``eval.tasks`` read and validated now (a bad file fails before training), or []."""
    if not prepared.eval_tasks:
        return []
    from d3ray.data.tokenizer import load_tokenizer
    from d3ray.eval.harness import prepare_tasks

    return prepare_tasks(prepared.eval_tasks, load_tokenizer(prepared.tokenizer_dir))
