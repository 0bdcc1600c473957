"""Byte-level BPE tokenizer: trained deterministically, saved in HF format, reused on resume."""

import pytest

from d3ray.data import DataConfig, TokenizerConfig, list_shards, write_sample_corpus
from d3ray.data.tokenizer import (
    encode_texts,
    ensure_tokenizer,
    load_backend_tokenizer,
    load_tokenizer,
    train_tokenizer,
)

CFG = DataConfig(tokenizer=TokenizerConfig(vocab_size=600, train_docs=300))


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = write_sample_corpus(tmp_path_factory.mktemp("corpus"), train_docs=400, validation_docs=70)
    return list_shards(str(root / "train"))


def test_train_tokenizer_same_sample_gives_identical_files(shards, tmp_path):
    a = train_tokenizer(shards, CFG, tmp_path / "a")
    b = train_tokenizer(shards, CFG, tmp_path / "b")
    assert (a / "tokenizer.json").read_bytes() == (b / "tokenizer.json").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]  # no temporary folder left behind


def test_trained_tokenizer_loads_with_transformers_and_round_trips_text(shards, tmp_path):
    from transformers import AutoTokenizer

    path = train_tokenizer(shards, CFG, tmp_path / "tok")
    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    assert len(tok) == 600
    assert tok.convert_ids_to_tokens(tok.eos_token_id) == "<|endoftext|>"
    backend, eos_id = load_backend_tokenizer(path)
    assert eos_id == tok.eos_token_id == load_tokenizer(path).eos_token_id
    text = "Григорианският календар\n\tdef f(x): return x ** 2  # ünïcödé 🚀"
    (ids,) = encode_texts(backend, [text])
    assert eos_id not in ids.tolist()  # no special tokens are added to documents
    assert tok.decode(ids.tolist()) == text  # byte-level BPE is lossless, even on unseen scripts
    assert ids.tolist() == tok(text, add_special_tokens=False)["input_ids"]


def test_ensure_tokenizer_trains_once_then_reuses(shards, tmp_path):
    first = ensure_tokenizer(CFG, shards, tmp_path)
    assert first == tmp_path / "tokenizer"
    content = (first / "tokenizer.json").read_bytes()
    bigger = DataConfig(tokenizer=TokenizerConfig(vocab_size=800, train_docs=300))
    again = ensure_tokenizer(bigger, shards, tmp_path)  # a resumed run keeps its token ids
    assert again == first and (again / "tokenizer.json").read_bytes() == content


def test_ensure_tokenizer_uses_configured_path(shards, tmp_path):
    path = train_tokenizer(shards, CFG, tmp_path / "mine")
    cfg = DataConfig(tokenizer=TokenizerConfig(path=str(path)))
    assert ensure_tokenizer(cfg, shards, tmp_path / "run") == path
    assert not (tmp_path / "run").exists()


def test_load_tokenizer_missing_dir_raises(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer directory not found"):
        load_tokenizer(tmp_path / "nope")
