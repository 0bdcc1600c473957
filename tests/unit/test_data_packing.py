"""Exact small cases of per-domain sequence packing (d3ray.data.packing)."""

import numpy as np
import pytest

from d3ray.data.packing import SequencePacker, TokenizedDocument, make_sample_id, parse_sample_id

EOS = 0


def doc(tokens, domain="X", shard="s", line=1):
    return TokenizedDocument(np.asarray(tokens, dtype=np.int32), domain, shard, line)


def test_packer_docstring_example_gives_expected_sequences():
    packer = SequencePacker(seq_len=4, eos_id=EOS)
    out = packer.feed(doc([11, 12, 13, 14, 15], "X", "s", 1))
    out += packer.feed(doc([21, 22], "X", "s", 2))
    out += packer.feed(doc([31, 32, 33], "Y", "s", 3))
    out += packer.flush()
    assert [(s.domain, s.sample_id, s.n_tokens, s.tokens.tolist()) for s in out] == [
        ("X", "s:1:0", 4, [11, 12, 13, 14]),
        ("X", "s:1:4", 4, [15, EOS, 21, 22]),
        ("Y", "s:3:0", 4, [31, 32, 33, EOS]),
        ("X", "s:2:2", 1, [EOS, EOS, EOS, EOS]),
    ]
    assert all(s.tokens.dtype == np.int32 for s in out)


def test_packer_domains_never_mix_in_one_sequence():
    packer = SequencePacker(seq_len=3, eos_id=EOS)
    out = (
        packer.feed(doc([1], "A", line=1))
        + packer.feed(doc([2], "B", line=2))
        + packer.feed(doc([3], "A", line=3))
    )
    assert [(s.domain, s.tokens.tolist(), s.sample_id) for s in out] == [("A", [1, EOS, 3], "s:1:0")]
    flushed = packer.flush(["B", "A"])
    assert [(s.domain, s.tokens.tolist(), s.n_tokens, s.sample_id) for s in flushed] == [
        ("B", [2, EOS, EOS], 2, "s:2:0"),
        ("A", [EOS, EOS, EOS], 1, "s:3:1"),
    ]


def test_packer_flush_orders_domains_and_empties_buffers():
    packer = SequencePacker(seq_len=8, eos_id=EOS)
    packer.feed(doc([1, 2], "Z"))
    packer.feed(doc([3], "A"))
    assert packer.pending_tokens() == {"Z": 3, "A": 2}
    assert [s.domain for s in packer.flush()] == ["A", "Z"]
    assert packer.pending_tokens() == {}
    assert packer.flush() == []


def test_packer_long_document_is_cut_at_every_t_tokens():
    packer = SequencePacker(seq_len=2, eos_id=EOS)
    out = packer.feed(doc([5, 6, 7, 8, 9], shard="train/a.jsonl.zst", line=7))
    assert [s.sample_id for s in out] == [
        "train/a.jsonl.zst:7:0",
        "train/a.jsonl.zst:7:2",
        "train/a.jsonl.zst:7:4",
    ]
    assert [s.tokens.tolist() for s in out] == [[5, 6], [7, 8], [9, EOS]]


def test_sample_id_round_trips_with_colons_in_shard_name():
    sid = make_sample_id("memory://bucket/x.jsonl", 12, 345)
    assert parse_sample_id(sid) == ("memory://bucket/x.jsonl", 12, 345)


def test_packer_rejects_nonpositive_seq_len():
    with pytest.raises(ValueError, match="seq_len"):
        SequencePacker(seq_len=0, eos_id=EOS)
