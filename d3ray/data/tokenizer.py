"""Train, save and load the run's tokenizer (byte-level BPE, Hugging Face format).

A run either trains a byte-level BPE (GPT-2 style: 256 byte symbols, so no unknown tokens) with
the ``tokenizers`` library on a deterministic sample of its training documents, or loads a local
Hugging Face tokenizer directory. The trained tokenizer is saved as a ``PreTrainedTokenizerFast``
directory (``tokenizer.json`` + ``tokenizer_config.json``) inside the run directory, next to
``d3ray_tokenizer.json``, the record of what it was trained from (data paths, layout, text and
domain keys, domains, vocabulary size, ...). A resumed run reuses it instead of training again, so
token ids never change under a checkpoint; a rerun whose config would train a different tokenizer stops and says which
fields changed instead of reusing it silently. A tokenizer is never trained on zero texts.

A user's tokenizer directory (``data.tokenizer.path``) is only ever read: loaded, or refused with one
line saying why (missing, no ``tokenizer.json``, a model directory without tokenizer files). d3ray
trains tokenizers into run directories only, and never writes into a path the user gave it.
Nothing is downloaded.

Documents are tokenized without special tokens; the packer adds ``<|endoftext|>`` (EOS) after
each document.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from d3ray.data.config import DEFAULT_DOMAIN_KEY, DEFAULT_TEXT_KEY, DataConfig, TokenizerConfig
from d3ray.data.records import iter_documents
from d3ray.data.shards import Shard
from d3ray.errors import DataPathError, UserError
from d3ray.run_files import atomic_directory

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

logger = logging.getLogger(__name__)

EOS_TOKEN = "<|endoftext|>"
TOKENIZER_SUBDIR = "tokenizer"
TRAINED_FROM_FILE = "d3ray_tokenizer.json"
"""Written next to a tokenizer d3ray trained: what it was trained from (and that d3ray owns the folder)."""
# Files a Hugging Face tokenizer directory holds (any one lets AutoTokenizer build a tokenizer).
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def sample_training_texts(shards: Sequence[Shard], cfg: DataConfig) -> Iterator[str]:
    """Deterministically pick ``cfg.tokenizer.train_docs`` good documents for BPE training.

    Up to ``train_docs`` shards spread evenly over the sorted list each give their first
    ``ceil(train_docs / n_used)`` good documents, so training reads only the heads of a few shards
    yet sees every part of the corpus listing. Each text is cut to ``train_chars_per_doc``.
    """
    tcfg = cfg.tokenizer
    if not shards:
        raise ValueError("no training shards to sample tokenizer training text from")
    n_used = min(len(shards), tcfg.train_docs)
    picked = [shards[(i * len(shards)) // n_used] for i in range(n_used)]
    quota = -(-tcfg.train_docs // n_used)
    emitted = 0
    for shard in picked:
        taken = 0
        for doc in iter_documents(shard, cfg.layout, cfg.domains, cfg.max_record_bytes, text_key=cfg.text_key,
                                  domain_key=cfg.domain_key):
            if doc.is_bad:
                continue
            yield doc.text[: tcfg.train_chars_per_doc]
            taken += 1
            emitted += 1
            if taken >= quota or emitted >= tcfg.train_docs:
                break
        if emitted >= tcfg.train_docs:
            return


def train_tokenizer(shards: Sequence[Shard], cfg: DataConfig, out_dir: str | Path,
                    trained_from: dict[str, Any] | None = None) -> Path:
    """Train a byte-level BPE on a sample of ``shards`` and save it to ``out_dir``.

    The directory is written to a temporary sibling first and renamed, so an interrupted run never
    leaves a half-written tokenizer behind for the next run to reuse.

    Returns:
        ``out_dir``, loadable with :func:`load_tokenizer` or ``AutoTokenizer.from_pretrained``.

    Raises:
        UserError: no good document in the sampled shards (a tokenizer is never trained on nothing).
    """
    texts = list(sample_training_texts(shards, cfg))
    if not texts:
        raise UserError(
            f"data.train_paths={list(cfg.train_paths) or [s.uri for s in shards[:3]]}: no usable document to "
            f"train the tokenizer on (every sampled record is bad); check the records' text and data.domains / "
            f"data.layout (`d3ray data inspect` counts bad records by reason)")
    return train_tokenizer_from_texts(texts, cfg.tokenizer, out_dir, trained_from)


def train_tokenizer_from_texts(texts: Sequence[str], tcfg: TokenizerConfig, out_dir: str | Path,
                               trained_from: dict[str, Any] | None = None) -> Path:
    """Train a byte-level BPE on ``texts`` (e.g. the SFT suite's prompts and responses) into ``out_dir``.

    Byte-level BPE encodes any text (256 byte symbols, no unknown token). With
    ``tcfg.split_digits`` every digit is its own pre-token, so numbers are never merged into
    multi-digit tokens (as LLaMA and PaLM do): arithmetic then works digit by digit.

    ``out_dir`` must be new, empty or a tokenizer d3ray trained (it holds ``d3ray_tokenizer.json``,
    which is written with ``trained_from``: what :func:`ensure_run_tokenizer` compares on reuse).

    Raises:
        UserError: ``texts`` is empty, or ``out_dir`` holds files d3ray did not write.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    out = Path(out_dir)
    if not texts:
        raise UserError(f"{out}: no text to train the tokenizer on (a BPE of zero texts is 257 byte tokens); "
                        "check that the training records are readable and of a known domain")
    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if tcfg.split_digits:
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=tcfg.vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS_TOKEN, bos_token=EOS_TOKEN, unk_token=EOS_TOKEN
    )
    record = {"trained_from": trained_from or {}, "texts": len(texts), "vocab_size": tok.get_vocab_size(),
              "created_unix": time.time()}
    with atomic_directory(out, owned_marker=TRAINED_FROM_FILE) as tmp:
        save_tokenizer(fast, tmp)
        (tmp / TRAINED_FROM_FILE).write_text(json.dumps(record, indent=2) + "\n")
    logger.info(
        "trained a byte-level BPE tokenizer (%d tokens, on %d texts) into %s",
        tok.get_vocab_size(),
        len(texts),
        out,
    )
    return out


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, out_dir: str | Path) -> None:
    """``save_pretrained``, naming the class every transformers version knows (5.x writes its own
    ``TokenizersBackend``, which 4.x cannot load)."""
    tokenizer.save_pretrained(str(out_dir))
    config_file = Path(out_dir) / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    if config.get("tokenizer_class") == "TokenizersBackend":
        config.pop("backend", None)
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
        config_file.write_text(json.dumps(config, indent=2) + "\n")


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    """Load a local Hugging Face tokenizer directory (never the hub).

    Raises:
        FileNotFoundError: ``path`` is not a directory.
        ValueError: the tokenizer is not a fast tokenizer or has no EOS token.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if not Path(path).is_dir():
        raise DataPathError(f"tokenizer directory not found: {path}")
    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    if not isinstance(tok, PreTrainedTokenizerFast):
        raise ValueError(f"{path}: {type(tok).__name__} is not a fast (tokenizers-backed) tokenizer")
    if tok.eos_token_id is None:
        raise ValueError(f"{path}: the tokenizer has no EOS token; set eos_token in tokenizer_config.json")
    return tok


def check_user_tokenizer(path: str | Path, field: str = "data.tokenizer.path") -> Path:
    """A tokenizer directory the user named, loaded once to check it (never written to).

    Raises:
        UserError: one line naming ``field``, the path and the fix: the path is missing or not a
            directory, holds no tokenizer files (a model directory is recognised and said so), or
            does not load as a fast tokenizer with an EOS token.
    """
    root = Path(path)
    if not root.exists():
        raise DataPathError(f"{field}={path}: no such directory; point it at a Hugging Face tokenizer "
                            "directory (tokenizer.json), or leave it unset to train one into the run directory")
    if not root.is_dir():
        raise UserError(f"{field}={path}: a file, not a directory; point it at the directory that holds tokenizer.json")
    if not any((root / name).is_file() for name in _TOKENIZER_FILES):
        if (root / "config.json").is_file():
            raise UserError(
                f"{field}={path}: a model directory without tokenizer files (config.json but no tokenizer.json); "
                "point the field at the model's tokenizer directory, or leave it unset to train one into the run "
                "directory; nothing in it was changed")
        raise UserError(f"{field}={path}: holds no tokenizer.json; point it at a Hugging Face tokenizer directory, "
                        "or leave it unset to train one into the run directory; nothing in it was changed")
    try:
        load_tokenizer(root)
    except (OSError, ValueError) as err:
        raise UserError(f"{field}={path}: does not load as a tokenizer ({err}); point it at a Hugging Face "
                        "tokenizer directory with a fast tokenizer and an EOS token") from err
    return root


def ensure_tokenizer(cfg: DataConfig, shards: Sequence[Shard], run_dir: str | Path) -> Path:
    """The tokenizer directory for a run: ``cfg.tokenizer.path`` if set (checked, never written), else
    ``run_dir/tokenizer``, trained on ``shards`` the first time and reused as it is on every later
    (resumed) run whose data and tokenizer config are the ones it was trained from."""
    if cfg.tokenizer.path is not None:
        return check_user_tokenizer(cfg.tokenizer.path)
    from d3ray.data.corpus import resolve_domains

    run_dir = Path(run_dir)
    cfg = resolve_domains(cfg, shards)  # data.domains=[]: as the run resolves them (a no-op when it did)
    paths = list(cfg.train_paths) or sorted({s.uri for s in shards})
    trained_from = {"data.train_paths": [_relative_to(p, run_dir) for p in paths],
                    "data.layout": cfg.layout, "data.domains": list(cfg.domains),
                    **_tokenizer_fields(cfg.tokenizer)}
    # The record fields, when not the defaults (a record without them was trained with the defaults).
    for key, value, default in (("data.text_key", cfg.text_key, DEFAULT_TEXT_KEY),
                                ("data.domain_key", cfg.domain_key, DEFAULT_DOMAIN_KEY)):
        if value != default:
            trained_from[key] = value
    return ensure_run_tokenizer(run_dir, trained_from, lambda: train_tokenizer(shards, cfg, run_dir / TOKENIZER_SUBDIR,
                                                                               trained_from))


def ensure_run_tokenizer(run_dir: str | Path, trained_from: dict[str, Any], train: Callable[[], Path]) -> Path:
    """``run_dir/tokenizer``: reused when it was trained from ``trained_from``, else made by ``train()``.

    Raises:
        UserError: the run's tokenizer was trained from something else (the message names the
            changed fields, old and new values, and the fix), or has no record of what it was trained
            from (left by an older d3ray, or by a failed run).
    """
    out = Path(run_dir) / TOKENIZER_SUBDIR
    if not (out / "tokenizer.json").is_file():
        return train()
    record_file = out / TRAINED_FROM_FILE
    if not record_file.is_file():
        raise UserError(f"{out}: a tokenizer without {TRAINED_FROM_FILE} (no record of what it was trained from, so "
                        "it cannot be reused safely); remove that folder to train it again, or use a new --name")
    old = json.loads(record_file.read_text()).get("trained_from", {})
    changed = sorted(k for k in {*old, *trained_from} if old.get(k) != trained_from.get(k))
    if changed:
        diff = "; ".join(f"{k}: {old.get(k)!r} then, {trained_from.get(k)!r} now" for k in changed)
        raise UserError(f"{out} was trained from another config ({diff}): set those fields back to resume this run, "
                        "or use a new --name (or remove that folder) to train a new tokenizer")
    logger.info("reusing the run's tokenizer in %s", out)
    return out


def sft_tokenizer_source(paths: Sequence[str], default_task: str, tcfg: TokenizerConfig, run_dir: str | Path,
                         layout: dict[str, Any] | None = None) -> dict[str, Any]:
    """What an SFT run's tokenizer is trained from (the record :func:`ensure_run_tokenizer` compares);
    ``layout`` (``SftFields.describe()``) is recorded when it is not d3ray's own default."""
    from d3ray.data.sft_formats import SftFields

    record = {"sft.paths": [_relative_to(p, Path(run_dir)) for p in paths], "sft.default_task": default_task,
              **_tokenizer_fields(tcfg)}
    if layout is not None and layout != SftFields().describe():
        record["sft.format"] = layout
    return record


def _tokenizer_fields(tcfg: TokenizerConfig) -> dict[str, Any]:
    return {f"data.tokenizer.{k}": getattr(tcfg, k)
            for k in ("vocab_size", "train_docs", "train_chars_per_doc", "split_digits")}


def _relative_to(path: str, run_dir: Path) -> str:
    """``path`` as recorded: relative to the run directory when inside it (a moved run still matches)."""
    try:
        return str(Path(path).resolve().relative_to(run_dir.resolve()))
    except ValueError:
        return path


def discard_fresh_tokenizer(run_dir: str | Path, since: float) -> bool:
    """Remove ``run_dir/tokenizer`` if d3ray trained it at or after ``since`` and the run has no
    checkpoint (a run that failed on its data must not leave it behind for the fixed rerun to reuse;
    a checkpoint's token ids, though, need it). Returns whether it did."""
    out = Path(run_dir) / TOKENIZER_SUBDIR
    record_file = out / TRAINED_FROM_FILE
    if not record_file.is_file() or json.loads(record_file.read_text()).get("created_unix", 0.0) < since:
        return False
    if any(Path(run_dir).glob("checkpoint_*")):
        return False
    shutil.rmtree(out)
    logger.info("removed %s, trained for this run, which failed", out)
    return True


def load_backend_tokenizer(path: str | Path) -> tuple[Tokenizer, int]:
    """The ``tokenizers.Tokenizer`` behind a tokenizer directory, and its EOS id.

    Reads ``tokenizer.json`` and the EOS token from ``tokenizer_config.json`` /
    ``special_tokens_map.json`` directly when they are there (0.2 s instead of the 2-5 s of
    importing transformers in every fresh Ray actor); otherwise goes through :func:`load_tokenizer`.
    """
    from tokenizers import Tokenizer

    root = Path(path)
    eos = _eos_token_from_files(root)
    if (root / "tokenizer.json").is_file() and eos is not None:
        backend = Tokenizer.from_file(str(root / "tokenizer.json"))
        eos_id = backend.token_to_id(eos)
        if eos_id is not None:
            return backend, eos_id
    tok = load_tokenizer(root)
    return tok.backend_tokenizer, int(tok.eos_token_id)


def _eos_token_from_files(root: Path) -> str | None:
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        file = root / name
        if file.is_file():
            eos = json.loads(file.read_text()).get("eos_token")
            if isinstance(eos, dict):
                eos = eos.get("content")
            if isinstance(eos, str) and eos:
                return eos
    return None


def encode_texts(backend: Tokenizer, texts: Sequence[str]) -> list[np.ndarray]:
    """Token ids of each text, without special tokens: a list of (n_i,) int32 arrays."""
    encodings = backend.encode_batch_fast(list(texts), add_special_tokens=False)
    return [np.asarray(e.ids, dtype=np.int32) for e in encodings]
