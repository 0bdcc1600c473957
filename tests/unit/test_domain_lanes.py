"""Mixed streams through one shared reader (d3ray.data.domain_lanes): the same draws as a lane per
domain, domains moving to lanes of their own only when the mixture starves the shared reader, and
cursors that resume to identical chunks in either mode. Over an in-memory source whose every
sequence is a read group of its own (so ``span_blocks`` counts sequences here); the Ray Data reader
is tests/integration/test_data_stream.py."""

import json
from collections import Counter

import pytest

from d3ray.data.chunker import ChunkStream
from tests.fakes import make_source

DOMAINS = ("a", "b", "c")


def stream(mixture, span, cursor=None, seed=4, shuffle=3, n=30):
    source = make_source(n, DOMAINS, span)
    return ChunkStream(source, batch_size=4, chunk_len=2, shuffle_buffer=shuffle, seed=seed,
                       mixture_for_chunk=mixture, cursor=cursor), source


def take(s, n):
    it = iter(s)
    return [next(it) for _ in range(n)]


def drawn(chunks):
    return [[(b.sample_ids, b.input_ids.tolist()) for b in c.batches] for c in chunks]


def natural(chunk_id):
    return {"a": 1 / 3, "b": 1 / 3, "c": 1 / 3}


def starving(chunk_id):  # a is wanted far above its natural third, then c alone, then back
    if chunk_id < 10:
        return {"a": 0.8, "b": 0.1, "c": 0.1}
    return {"c": 1.0} if chunk_id < 15 else {"a": 0.2, "b": 0.5, "c": 0.3}


def changing(chunk_id):
    return None if chunk_id % 4 else {"a": 0.5 - chunk_id / 100, "b": 0.0 if chunk_id < 8 else 0.3,
                                      "c": 0.5 + chunk_id / 100 - (0.0 if chunk_id < 8 else 0.3)}


@pytest.mark.parametrize("mixture", [natural, starving, changing], ids=["natural", "starving", "changing"])
@pytest.mark.parametrize("span", [1, 3, 50])
def test_the_shared_reader_draws_exactly_what_a_lane_per_domain_draws(mixture, span):
    lanes, _ = stream(mixture, 0)
    shared, _ = stream(mixture, span)
    assert drawn(take(shared, 30)) == drawn(take(lanes, 30))  # 240 draws: several epochs of each domain
    assert shared.stats.domain_epochs == lanes.stats.domain_epochs
    assert shared.stats.domain_draws == lanes.stats.domain_draws


def test_a_natural_mixture_stays_on_the_shared_reader_and_reads_the_corpus_once_per_epoch():
    s, source = stream(natural, 60, shuffle=0)  # a block is one sequence here: i.i.d. draws wander
    chunks = take(s, 30)  # 240 draws = 8 epochs of the 30 sequences
    assert s.domain_lanes.moved_to_lanes == [] and s.lanes == {}
    assert all(r.seqs == source.seqs for r in source.readers)  # only all-domain readers were opened
    assert len(source.readers) == 8 + 1  # one per epoch, the ninth just opened
    assert sum(r.reads for r in source.readers) == 240 + sum(len(q.queue) for q in s.domain_lanes.shared.values())
    assert len({sid for c in chunks for b in c.batches for sid in b.sample_ids}) == 240


def test_the_starved_domain_moves_to_a_lane_of_its_own_and_the_last_shared_domain_stays():
    s, source = stream(lambda c: {"a": 1.0} if c < 10 else {"c": 1.0}, 2)
    take(s, 30)
    # a alone: b's and c's queues grow until a (sought) moves; then c alone: b's queue is stale, c moves
    assert s.domain_lanes.moved_to_lanes == ["a", "c"]
    assert set(s.lanes) == {"a", "c"} and set(s.domain_lanes.shared) == {"b"}
    moved = s.domain_lanes.moved_to_lanes
    lane_readers = Counter(r.seqs[0].domain for r in source.readers if len({q.domain for q in r.seqs}) == 1)
    assert set(lane_readers) == set(moved)


@pytest.mark.parametrize("span", [0, 2, 50])
def test_every_cursor_resumes_to_identical_chunks_and_a_resume_re_reads_at_most_the_queues_span(span):
    full, _ = stream(starving, span)
    chunks = take(full, 24)
    for k in range(1, 24):
        cursor = json.loads(json.dumps(chunks[k].cursor))
        resumed, source = stream(starving, span, cursor=cursor)
        assert drawn(take(resumed, 24 - k)) == drawn(chunks[k:])
        assert resumed.stats.domain_draws == Counter(
            d for c in chunks[k:] for b in c.batches for d in b.domains)
        shared = cursor["shared"]
        if shared is not None:  # the shared reader restarts at the oldest queued sequence
            first = next(r for r in source.readers if r.seqs == source.seqs)
            assert first.start == shared["reader"]["i"]
            taken_before = sum(shared["skip"].values())
            assert taken_before <= span + 1  # at most the sequences of the queues' span


@pytest.mark.parametrize(("written", "read"), [(0, 3), (3, 0)])
def test_a_cursor_of_either_mode_resumes_in_the_other(written, read):
    full, _ = stream(changing, written)
    chunks = take(full, 20)
    for k in (3, 11, 19):
        cursor = json.loads(json.dumps(chunks[k].cursor))
        resumed, _ = stream(changing, read, cursor=cursor)
        assert drawn(take(resumed, 20 - k)) == drawn(chunks[k:])


def test_an_empty_domain_is_a_clear_error_on_the_shared_reader():
    s, _ = stream(lambda c: {"a": 0.5, "b": 0.5}, 3)
    source = s.source
    source.domains.append("z")
    with pytest.raises(ValueError, match=r"domain 'z' has weight 1.0 but the corpus has no z sequences"):
        take(ChunkStream(source, 4, 2, mixture_for_chunk=lambda c: {"z": 1.0}), 1)
