"""Byte-level BPE tokenizer: trained deterministically, saved in HF format, reused on resume."""

import json
import time

import pytest

from d3ray.data import DataConfig, TokenizerConfig, list_shards, write_sample_corpus
from d3ray.data.tokenizer import (
    TRAINED_FROM_FILE,
    check_user_tokenizer,
    discard_fresh_tokenizer,
    encode_texts,
    ensure_tokenizer,
    load_backend_tokenizer,
    load_tokenizer,
    train_tokenizer,
    train_tokenizer_from_texts,
)
from d3ray.errors import UserError

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
    again = ensure_tokenizer(CFG, shards, tmp_path)  # a resumed run keeps its token ids
    assert again == first and (again / "tokenizer.json").read_bytes() == content
    record = json.loads((first / TRAINED_FROM_FILE).read_text())
    assert record["texts"] == 300 and record["trained_from"]["data.tokenizer.vocab_size"] == 600


def test_ensure_tokenizer_rerun_with_changed_vocab_size_says_so_and_keeps_the_old_one(shards, tmp_path):
    first = ensure_tokenizer(CFG, shards, tmp_path)
    content = (first / "tokenizer.json").read_bytes()
    bigger = DataConfig(tokenizer=TokenizerConfig(vocab_size=800, train_docs=300))
    with pytest.raises(UserError, match=r"data\.tokenizer\.vocab_size: 600 then, 800 now"):
        ensure_tokenizer(bigger, shards, tmp_path)
    assert (first / "tokenizer.json").read_bytes() == content


def test_ensure_tokenizer_without_a_training_record_is_not_reused(shards, tmp_path):
    """A tokenizer left without a record of its training data (an older d3ray, e.g. one trained on no text
    at all) is refused, not silently reused."""
    first = ensure_tokenizer(CFG, shards, tmp_path)
    (first / TRAINED_FROM_FILE).unlink()
    with pytest.raises(UserError, match=f"without {TRAINED_FROM_FILE}"):
        ensure_tokenizer(CFG, shards, tmp_path)


def test_train_tokenizer_on_zero_texts_raises_and_writes_nothing(tmp_path):
    with pytest.raises(UserError, match="no text to train the tokenizer on"):
        train_tokenizer_from_texts([], TokenizerConfig(vocab_size=300), tmp_path / "tok")
    assert not (tmp_path / "tok").exists()


def test_discard_fresh_tokenizer_removes_only_this_runs_tokenizer_without_checkpoints(shards, tmp_path):
    before = time.time()
    ensure_tokenizer(CFG, shards, tmp_path / "a")
    after = time.time()
    assert not discard_fresh_tokenizer(tmp_path / "a", since=after + 1)  # trained by an earlier invocation
    (tmp_path / "a" / "checkpoint_2026-01-01_00-00-00.000000").mkdir()
    assert not discard_fresh_tokenizer(tmp_path / "a", since=before)  # a checkpoint's token ids need it
    assert (tmp_path / "a" / "tokenizer" / "tokenizer.json").is_file()
    ensure_tokenizer(CFG, shards, tmp_path / "b")
    assert discard_fresh_tokenizer(tmp_path / "b", since=before)
    assert not (tmp_path / "b" / "tokenizer").exists()


def test_ensure_tokenizer_uses_configured_path(shards, tmp_path):
    path = train_tokenizer(shards, CFG, tmp_path / "mine")
    cfg = DataConfig(tokenizer=TokenizerConfig(path=str(path)))
    assert ensure_tokenizer(cfg, shards, tmp_path / "run") == path
    assert not (tmp_path / "run").exists()


def test_ensure_tokenizer_model_dir_as_path_is_refused_and_left_untouched(shards, tmp_path):
    model = tmp_path / "my-model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "gpt2"}')
    (model / "model.safetensors").write_bytes(b"weights")
    cfg = DataConfig(tokenizer=TokenizerConfig(path=str(model)))
    with pytest.raises(UserError, match=r"data\.tokenizer\.path=.*my-model: a model directory without tokenizer"):
        ensure_tokenizer(cfg, shards, tmp_path / "run")
    assert sorted(p.name for p in model.iterdir()) == ["config.json", "model.safetensors"]
    assert (model / "model.safetensors").read_bytes() == b"weights"


@pytest.mark.parametrize(("make", "message"), [
    (lambda p: p.mkdir(), "holds no tokenizer.json"),
    (lambda p: None, "no such directory"),
    (lambda p: p.write_text("x"), "a file, not a directory"),
])
def test_check_user_tokenizer_unusable_path_names_field_path_and_fix(tmp_path, make, message):
    path = tmp_path / "tok"
    make(path)
    with pytest.raises(UserError, match=f"data.tokenizer.path={path}: {message}") as info:
        check_user_tokenizer(path)
    assert "\n" not in str(info.value)


def test_load_tokenizer_missing_dir_raises(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer directory not found"):
        load_tokenizer(tmp_path / "nope")
