"""Evaluation sets: per-domain held-out sequences and a raw text file's windows."""

from pathlib import Path

import numpy as np
import pytest

from d3ray.data import DEFAULT_DOMAINS, DataConfig, TokenizerConfig, list_shards, write_sample_corpus
from d3ray.data.evaluation import load_eval_sequences, load_text_file_sequences
from d3ray.data.packing import SequencePacker, TokenizedDocument
from d3ray.data.records import iter_documents
from d3ray.data.tokenizer import encode_texts, load_backend_tokenizer, train_tokenizer

WIKITEXT = (
    Path(__file__).resolve().parents[2].parent
    / "shared"
    / "data"
    / "eval"
    / "wikitext2_raw_test"
    / "wiki.test.raw"
)
CFG = DataConfig(seq_len=32, tokenizer=TokenizerConfig(vocab_size=500, train_docs=200))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = write_sample_corpus(tmp_path_factory.mktemp("corpus"), train_docs=200, validation_docs=70)
    tok = train_tokenizer(list_shards(str(root / "train")), CFG, root / "tokenizer")
    return root, tok


def test_load_eval_sequences_per_domain_first_full_sequences(corpus):
    root, tok = corpus
    got = load_eval_sequences(str(root / "validation"), CFG, tok, max_sequences_per_domain=5)
    assert list(got) == list(DEFAULT_DOMAINS)
    assert all(a.shape == (5, 32) and a.dtype == np.int32 for a in got.values())
    # reference: pack the same documents with the pure packer and keep the first 5 full ones per domain
    backend, eos = load_backend_tokenizer(tok)
    packer = SequencePacker(32, eos)
    expected: dict[str, list] = {d: [] for d in DEFAULT_DOMAINS}
    for shard in list_shards(str(root / "validation")):
        for doc in iter_documents(shard, "auto", DEFAULT_DOMAINS, 1 << 20):
            (ids,) = encode_texts(backend, [doc.text])
            for seq in packer.feed(TokenizedDocument(ids, doc.domain, doc.shard, doc.line)):
                expected[seq.domain].append(seq.tokens)
    for domain, arr in got.items():
        np.testing.assert_array_equal(arr, np.stack(expected[domain][:5]))


@pytest.mark.skipif(not WIKITEXT.is_file(), reason=f"WikiText-2 test file not found at {WIKITEXT}")
def test_load_text_file_sequences_wikitext_windows_decode_to_the_file_start(corpus):
    _, tok = corpus
    arr = load_text_file_sequences(str(WIKITEXT), tok, seq_len=64, max_sequences=20)
    assert arr.shape == (20, 64) and arr.dtype == np.int32
    backend, eos = load_backend_tokenizer(tok)
    assert eos not in arr
    text = backend.decode(arr.reshape(-1).tolist())
    assert WIKITEXT.read_text(encoding="utf-8").startswith(text)


def test_load_text_file_sequences_too_short_raises(corpus, tmp_path):
    _, tok = corpus
    (tmp_path / "short.txt").write_text("just a few words\n")
    with pytest.raises(ValueError, match="fewer than one sequence"):
        load_text_file_sequences(str(tmp_path / "short.txt"), tok, seq_len=64, max_sequences=2)
