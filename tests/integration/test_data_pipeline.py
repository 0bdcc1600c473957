"""The Ray Data stream (read + tokenize tasks, or an actor pool → pack) on a generated corpus with bad records."""

import json

import numpy as np
import pytest
import zstandard

from d3ray.data import (
    BadRecordFractionError,
    BadRecordLedger,
    DataConfig,
    TokenizerConfig,
    list_shards,
    write_sample_corpus,
)
from d3ray.data.corpus_source import iter_packed_sequences
from d3ray.data.pipeline import document_dataset
from d3ray.data.tokenizer import train_tokenizer
from tests.conftest import start_local_ray
from tests.data_oracle import reference_sequences

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def ray_local():
    """The session's shared local Ray (tests/conftest.py)."""
    return start_local_ray()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = write_sample_corpus(
        tmp_path_factory.mktemp("corpus"), train_docs=240, validation_docs=14, train_shards=3
    )
    good = [
        json.dumps({"text": f"extra {i}", "meta": {"redpajama_set_name": "RedPajamaC4"}}) for i in range(3000)
    ]
    lines = good[:2] + ["{not json"] + good[2:]
    blob = zstandard.ZstdCompressor().compress(("\n".join(lines) + "\n").encode())
    (root / "train" / "chunk1" / "example_train_9.jsonl.zst").write_bytes(
        blob[: len(blob) * 3 // 4]
    )  # truncated
    cfg = DataConfig(
        seq_len=64,
        tokenize_actors=2,
        tokenize_batch_size=64,
        max_bad_fraction=0.01,
        min_records_before_check=100,
        tokenizer=TokenizerConfig(vocab_size=500, train_docs=200),
    )
    shards = list_shards(str(root / "train"))
    return shards, cfg, train_tokenizer(shards, cfg, root / "tokenizer")


def test_iter_packed_sequences_matches_pure_reference_and_counts_bad_records(ray_local, corpus):
    shards, cfg, tok = corpus
    ledger = BadRecordLedger()
    got = list(iter_packed_sequences(shards, cfg, tok, ledger))
    expected = reference_sequences(shards, cfg, tok)
    assert [s.sample_id for s in got] == [s.sample_id for s in expected]
    assert [s.domain for s in got] == [s.domain for s in expected]
    np.testing.assert_array_equal(np.stack([s.tokens for s in got]), np.stack([s.tokens for s in expected]))
    assert len(got) > 100 and len({s.sample_id for s in got}) == len(got)
    bad_shard = "train/chunk1/example_train_9.jsonl.zst"
    assert ledger.bad_by_reason() == {"malformed_json": 1, "truncated_zstd": 1}
    assert ledger.first_lines[(bad_shard, "malformed_json")] == [3]
    assert ledger.good[bad_shard] > 1000  # the truncated shard's good lines are all kept
    assert ledger.total_good == 240 + ledger.good[bad_shard]


def test_iter_packed_sequences_too_many_bad_records_stops_with_clear_error(ray_local, corpus):
    shards, cfg, tok = corpus
    strict = DataConfig(seq_len=64, max_bad_fraction=0.0, min_records_before_check=0)
    with pytest.raises(BadRecordFractionError, match=r"worst file train/chunk1/example_train_9\.jsonl\.zst"):
        for _ in iter_packed_sequences(shards[-1:], strict, tok):
            pass


@pytest.mark.parametrize(("n_shards", "stage"), [(1, "TokenizeBatch"), (3, "read_and_tokenize")])
def test_two_tokenizers_share_one_shard_in_an_actor_pool_or_read_two_shards_at_once(ray_local, corpus, n_shards, stage):
    """``tokenize_actors: 2``: one shard → read tasks feed two tokenizer actors; three shards → a
    read-and-tokenize task per shard, two at once. Either way, the sequences of the pure reference."""
    shards, cfg, tok = corpus
    shards = shards[:n_shards]  # the generated shards (the bad one is listed last)
    plan = str(document_dataset(shards, cfg, tok))
    other = ({"TokenizeBatch", "read_and_tokenize"} - {stage}).pop()
    assert stage in plan and other not in plan, plan
    got = list(iter_packed_sequences(shards, cfg, tok))
    expected = reference_sequences(shards, cfg, tok)
    assert [s.sample_id for s in got] == [s.sample_id for s in expected]
    np.testing.assert_array_equal(np.stack([s.tokens for s in got]), np.stack([s.tokens for s in expected]))
