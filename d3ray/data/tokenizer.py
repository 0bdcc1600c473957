"""Train, save and load the run's tokenizer (byte-level BPE, Hugging Face format).

A run either trains a byte-level BPE (GPT-2 style: 256 byte symbols, so no unknown tokens) with
the ``tokenizers`` library on a deterministic sample of its training documents, or loads a local
Hugging Face tokenizer directory. The trained tokenizer is saved as a ``PreTrainedTokenizerFast``
directory (``tokenizer.json`` + ``tokenizer_config.json``) inside the run directory, and a resumed
run reuses it instead of training again, so token ids never change under a checkpoint.
Nothing is downloaded.

Documents are tokenized without special tokens; the packer adds ``<|endoftext|>`` (EOS) after
each document.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from d3ray.data.config import DataConfig, TokenizerConfig
from d3ray.data.records import iter_documents
from d3ray.data.shards import Shard
from d3ray.errors import DataPathError
from d3ray.run_files import atomic_directory

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

logger = logging.getLogger(__name__)

EOS_TOKEN = "<|endoftext|>"
TOKENIZER_SUBDIR = "tokenizer"


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
        for doc in iter_documents(shard, cfg.layout, cfg.domains, cfg.max_record_bytes):
            if doc.is_bad:
                continue
            yield doc.text[: tcfg.train_chars_per_doc]
            taken += 1
            emitted += 1
            if taken >= quota or emitted >= tcfg.train_docs:
                break
        if emitted >= tcfg.train_docs:
            return


def train_tokenizer(shards: Sequence[Shard], cfg: DataConfig, out_dir: str | Path) -> Path:
    """Train a byte-level BPE on a sample of ``shards`` and save it to ``out_dir``.

    The directory is written to a temporary sibling first and renamed, so an interrupted run never
    leaves a half-written tokenizer behind for the next run to reuse.

    Returns:
        ``out_dir``, loadable with :func:`load_tokenizer` or ``AutoTokenizer.from_pretrained``.
    """
    texts = list(sample_training_texts(shards, cfg))
    return train_tokenizer_from_texts(texts, cfg.tokenizer, out_dir)


def train_tokenizer_from_texts(texts: Sequence[str], tcfg: TokenizerConfig, out_dir: str | Path) -> Path:
    """Train a byte-level BPE on ``texts`` (e.g. the SFT suite's prompts and responses) into ``out_dir``.

    Byte-level BPE encodes any text (256 byte symbols, no unknown token). With
    ``tcfg.split_digits`` every digit is its own pre-token, so numbers are never merged into
    multi-digit tokens (as LLaMA and PaLM do): arithmetic then works digit by digit.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    out = Path(out_dir)
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
    with atomic_directory(out) as tmp:
        save_tokenizer(fast, tmp)
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


def ensure_tokenizer(cfg: DataConfig, shards: Sequence[Shard], run_dir: str | Path) -> Path:
    """The tokenizer directory for a run: ``cfg.tokenizer.path`` if set, else ``run_dir/tokenizer``,
    trained on ``shards`` the first time and reused as it is on every later (resumed) run."""
    if cfg.tokenizer.path is not None:
        load_tokenizer(cfg.tokenizer.path)  # fail now, not inside a Ray actor
        return Path(cfg.tokenizer.path)
    out = Path(run_dir) / TOKENIZER_SUBDIR
    if (out / "tokenizer.json").is_file():
        logger.info("reusing the run's tokenizer in %s", out)
        return out
    return train_tokenizer(shards, cfg, out)


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
