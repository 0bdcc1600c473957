"""Property: packing keeps every token of every document exactly once, in order, per domain."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from d3ray.data.packing import SequencePacker, TokenizedDocument, parse_sample_id

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
