"""Property: packing keeps every token of every document exactly once, in order, per domain, and
packing in blocks (with a JSON state round trip between them) equals packing one document at a time."""

import json

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from d3ray.data.packing import SequencePacker, TokenBlock, TokenizedDocument, parse_sample_id

EOS = 0

documents = st.lists(
    st.tuples(st.sampled_from(["A", "B", "C"]), st.lists(st.integers(1, 50), min_size=0, max_size=40)),
    min_size=0,
    max_size=25,
)


@settings(max_examples=200, deadline=None)
@given(docs=documents, seq_len=st.integers(1, 17))
def test_packing_every_token_once_in_order_per_domain(docs, seq_len):
    packer = SequencePacker(seq_len=seq_len, eos_id=EOS)
    tokenized = [
        TokenizedDocument(np.asarray(t, dtype=np.int32), d, "s", i + 1) for i, (d, t) in enumerate(docs)
    ]
    seqs = [s for doc in tokenized for s in packer.feed(doc)] + packer.flush()

    for domain in {d for d, _ in docs}:
        expected = [tok for d, t in docs if d == domain for tok in [*t, EOS]]
        mine = [s for s in seqs if s.domain == domain]
        got = [tok for s in mine for tok in s.tokens[: s.n_tokens].tolist()]
        assert got == expected
        # only the last sequence of a domain may be partial, and it is EOS-padded
        assert all(s.n_tokens == seq_len for s in mine[:-1])
        assert 1 <= mine[-1].n_tokens <= seq_len
        assert mine[-1].tokens[mine[-1].n_tokens :].tolist() == [EOS] * (seq_len - mine[-1].n_tokens)
    assert all(s.tokens.shape == (seq_len,) for s in seqs)

    # each sample id names the document line and offset of the sequence's first token
    ids = [s.sample_id for s in seqs]
    assert len(set(ids)) == len(ids)
    for s in seqs:
        _, line, offset = parse_sample_id(s.sample_id)
        domain, tokens = docs[line - 1]
        assert domain == s.domain
        assert s.tokens[0] == [*tokens, EOS][offset]


@settings(max_examples=200, deadline=None)
@given(docs=documents, seq_len=st.integers(1, 17), cuts=st.lists(st.integers(0, 25), max_size=6),
       restore_at=st.integers(0, 6))
def test_packing_in_blocks_with_a_state_round_trip_equals_one_document_at_a_time(docs, seq_len, cuts, restore_at):
    tokenized = [
        TokenizedDocument(np.asarray(t, dtype=np.int32), d, "s", i + 1) for i, (d, t) in enumerate(docs)
    ]
    one = SequencePacker(seq_len=seq_len, eos_id=EOS)
    expected = [s for doc in tokenized for s in one.feed(doc)] + one.flush(["C", "B", "A"])

    bounds = sorted({0, len(docs), *(min(c, len(docs)) for c in cuts)})
    packer = SequencePacker(seq_len=seq_len, eos_id=EOS)
    got = []
    for k, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False)):
        if k == restore_at:  # a fresh packer restored from the JSON state continues identically
            state = json.loads(json.dumps(packer.state()))
            packer = SequencePacker(seq_len=seq_len, eos_id=EOS)
            packer.load_state(state)
        got += packer.feed_block(TokenBlock.of(tokenized[a:b]))
    got += packer.flush(["C", "B", "A"])
    assert [(s.domain, s.sample_id, s.n_tokens) for s in got] == [
        (s.domain, s.sample_id, s.n_tokens) for s in expected
    ]
    assert all(np.array_equal(g.tokens, e.tokens) for g, e in zip(got, expected, strict=True))


@settings(max_examples=300, deadline=None)
@given(docs=documents, seq_len=st.integers(1, 9), taken=st.integers(0, 60))
def test_restart_point_inside_a_block_continues_with_the_untaken_sequences(docs, seq_len, taken):
    tokenized = [
        TokenizedDocument(np.asarray(t, dtype=np.int32), d, "s", i + 1) for i, (d, t) in enumerate(docs)
    ]
    half = len(tokenized) // 3
    packer = SequencePacker(seq_len=seq_len, eos_id=EOS)
    packer.feed_block(TokenBlock.of(tokenized[:half]))
    before = packer.snapshot()
    made = packer.feed_block(TokenBlock.of(tokenized[half:]))
    taken = min(taken, len(made))
    point = packer.restart_point(taken, before)
    rest = made[taken:] + packer.flush()
    if point is None:  # nothing taken: restart at the block's start
        row, skip, carry = 0, 0, before
    else:
        row, skip, carry = point
    again = SequencePacker(seq_len=seq_len, eos_id=EOS)
    again.load_state(SequencePacker.state_of(carry))
    redo = again.feed_block(TokenBlock.of(tokenized[half + row :])) + again.flush()
    assert [(s.sample_id, s.tokens.tolist()) for s in redo[skip:]] == [(s.sample_id, s.tokens.tolist()) for s in rest]
