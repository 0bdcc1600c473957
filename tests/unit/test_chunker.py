"""Chunk stream: batches of B, chunks of L, epochs, dropped tails counted, seeded shuffle,
mixing by domain and cursors, over an in-memory source (the Ray Data source: tests/integration)."""

import json
from collections import Counter

import numpy as np
import pytest

from d3ray.data.chunker import ChunkStream
from d3ray.data.shuffle import ShuffleBuffer
from d3ray.schedule.scheduler import random_order
from d3ray.train.config import TrainConfig
from d3ray.train.deepspeed_config import lr_factor
from tests.fakes import ListSource, make_source


def take(stream, n):
    it = iter(stream)
    return [next(it) for _ in range(n)]


def test_chunk_stream_batches_chunks_and_epoch_tail_counted():
    # 11 sequences, B=2, L=2: epoch = 5 batches → chunks of 2, 2, 1; one sequence dropped per epoch.
    stream = ChunkStream(make_source(11), batch_size=2, chunk_len=2)
    chunks = take(stream, 4)
    assert [c.size for c in chunks] == [2, 2, 1, 2]
    assert [c.chunk_id for c in chunks] == [0, 1, 2, 3]
    assert [c.epoch for c in chunks] == [0, 0, 0, 1]
    assert stream.stats.dropped_tail_sequences == 1
    first = [sid for c in chunks[:3] for b in c.batches for sid in b.sample_ids]
    assert first == [f"0/s:{i}:0" for i in range(10)]
    assert chunks[3].batches[0].sample_ids == ("1/s:0:0", "1/s:1:0")


def test_chunk_stream_empty_epoch_raises_clear_error():
    stream = ChunkStream(make_source(1), batch_size=2, chunk_len=2)
    with pytest.raises(ValueError, match="fewer than one global batch"):
        take(stream, 1)


def shuffle_all(items, size, seed):
    buf, out = ShuffleBuffer(size, seed), []
    for item in items:
        if (x := buf.push(item)) is not None:
            out.append(x)
    while (x := buf.pop()) is not None:
        out.append(x)
    return out


def test_shuffle_buffer_is_seeded_permutation():
    a = shuffle_all(range(100), 16, [0, 1])
    b = shuffle_all(range(100), 16, [0, 1])
    c = shuffle_all(range(100), 16, [0, 2])
    assert a == b and sorted(a) == list(range(100)) and a != c and a != list(range(100))


def test_random_order_is_seeded_permutation_per_chunk():
    assert sorted(random_order(8, 0, 3)) == list(range(8))
    assert random_order(8, 0, 3) == random_order(8, 0, 3)
    assert random_order(8, 0, 3) != random_order(8, 0, 4)


def test_lr_factor_warmup_then_cosine_to_floor():
    cfg = TrainConfig(steps=110, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_factor(0, cfg) == pytest.approx(0.1)
    assert lr_factor(9, cfg) == pytest.approx(1.0)
    assert lr_factor(60, cfg) == pytest.approx(0.1 + 0.9 * 0.5)
    assert lr_factor(110, cfg) == pytest.approx(0.1)


def ids_of(chunks):
    return [[b.sample_ids for b in c.batches] for c in chunks]


def test_chunk_stream_resumes_from_every_cursor_with_identical_chunks_and_no_rereading():
    source = make_source(23)
    full = take(ChunkStream(source, batch_size=2, chunk_len=2, shuffle_buffer=5, seed=3), 9)  # 3+ epochs
    for k, chunk in enumerate(full):
        cursor = json.loads(json.dumps(chunk.cursor))
        resumed_source = make_source(23)
        resumed = take(ChunkStream(resumed_source, 2, 2, shuffle_buffer=5, seed=3, cursor=cursor), len(full) - k)
        assert ids_of(resumed) == ids_of(full[k:])
        assert [c.chunk_id for c in resumed] == list(range(k, len(full)))
        assert all(np.array_equal(a.input_ids, b.input_ids)
                   for x, y in zip(resumed, full[k:], strict=True) for a, b in zip(x.batches, y.batches, strict=True))
        # the first reader starts where the cursor points: it never hands out a consumed sequence
        first = resumed_source.readers[0]
        assert first.i - first.reads == cursor["lane"]["reader"]["i"]


def mixed_stream(source, mixture, seed=0, cursor=None, B=4, L=2):
    return ChunkStream(source, batch_size=B, chunk_len=L, seed=seed, mixture_for_chunk=mixture, cursor=cursor)


def test_mixed_stream_static_mixture_reproduces_proportions_and_is_deterministic():
    def static(chunk_id):
        return {"a": 0.7, "b": 0.2, "c": 0.1}

    chunks = take(mixed_stream(make_source(30, ("a", "b", "c")), static), 250)  # 2000 draws
    again = take(mixed_stream(make_source(30, ("a", "b", "c")), static), 250)
    assert ids_of(chunks) == ids_of(again)
    counts = Counter(d for c in chunks for b in c.batches for d in b.domains)
    n = sum(counts.values())
    for domain, w in static(0).items():  # within 4 binomial standard deviations
        assert abs(counts[domain] / n - w) < 4 * np.sqrt(w * (1 - w) / n)
    assert all(c.mixture == static(0) for c in chunks)


def test_mixed_stream_exactly_once_per_domain_epoch_with_restarts_counted():
    source = make_source(30, ("a", "b", "c"))  # 10 sequences per domain
    stream = mixed_stream(source, lambda c: {"a": 0.5, "b": 0.5} if c < 20 else {"c": 1.0})
    chunks = take(stream, 40)
    drawn = [(d, sid) for c in chunks for b in c.batches for d, sid in zip(b.domains, b.sample_ids, strict=True)]
    assert len(set(sid for _, sid in drawn)) == len(drawn)  # each sample id at most once
    by_epoch = Counter((d, sid.split("/")[0]) for d, sid in drawn)
    for (domain, epoch), count in by_epoch.items():
        completed = int(epoch) < stream.stats.domain_epochs.get(domain, 0)
        assert count == 10 if completed else count <= 10  # a completed domain epoch: all 10, once
    assert stream.stats.domain_epochs["c"] == 160 // 10 - 1 and "a" in stream.stats.domain_epochs
    assert {d for c in chunks[20:] for b in c.batches for d in b.domains} == {"c"}
    assert stream.stats.domain_draws == Counter(d for d, _ in drawn)


def test_mixed_stream_resumes_from_a_cursor_with_identical_chunks():
    def mixture(c):
        return None if c % 3 else {"a": 0.6 - c / 100, "b": 0.3, "c": 0.1 + c / 100}  # None: keep the last

    full = take(mixed_stream(make_source(30, ("a", "b", "c")), mixture, seed=5), 30)
    for k in (1, 7, 29):
        cursor = json.loads(json.dumps(full[k].cursor))
        resumed = take(mixed_stream(make_source(30, ("a", "b", "c")), mixture, seed=5, cursor=cursor), 30 - k)
        assert ids_of(resumed) == ids_of(full[k:])
        assert [c.mixture for c in resumed] == [c.mixture for c in full[k:]]


def test_mixed_stream_bad_mixtures_raise_errors_naming_the_field():
    source = make_source(30, ("a", "b", "c"))
    cases = [
        ({"a": 0.5, "z": 0.5}, r"mixture_for_chunk\(0\): unknown domain\(s\) \['z'\]"),
        ({"a": 1.5, "b": -0.5}, r"mixture_for_chunk\(0\)\.b: weight must be >= 0"),
        ({"a": 0.5, "b": 0.4}, r"mixture_for_chunk\(0\): weights must sum to 1"),
        ({"a": float("nan"), "b": 1.0}, r"mixture_for_chunk\(0\)\.a: weight must be a finite number"),
        (None, r"mixture_for_chunk\(0\) gave no mixture"),
    ]
    for mixture, message in cases:
        with pytest.raises(ValueError, match=message):
            take(mixed_stream(source, lambda c, m=mixture: m), 1)
    empty = ListSource(make_source(30, ("a", "b")).seqs, ("a", "b", "c"))
    with pytest.raises(ValueError, match=r"domain 'c' has weight 1.0 but the corpus has no c sequences"):
        take(mixed_stream(empty, lambda c: {"c": 1.0}), 1)
    with pytest.raises(ValueError, match="a mixer cannot be added or removed on resume"):
        ChunkStream(source, 2, 2, cursor=take(mixed_stream(source, lambda c: {"a": 1.0}), 1)[0].cursor)


def test_require_mixable_names_the_field_for_a_single_domain_corpus():
    from d3ray.data.mixture import require_mixable

    with pytest.raises(ValueError, match=r"schedule.type: a domain mixer needs .* \['RedPajamaC4'\]"):
        require_mixable(["RedPajamaC4", "RedPajamaC4"], "schedule.type")
    require_mixable(["RedPajamaC4", "RedPajamaBook"])


def test_chunks_to_train_counts_the_chunk_an_epoch_cut_adds():
    from d3ray.data.chunker import chunks_to_train, total_chunks

    # every chunk full: the fixed count, at the start, at each boundary and on a resume inside a chunk
    assert total_chunks(24, 4) == 6
    assert [chunks_to_train(v, 4 * v, 24, 4) for v in range(6)] == [6] * 6
    assert chunks_to_train(2, 10, 13, 4) == total_chunks(13, 4) == 4  # resumed at chunk 2's third step
    # chunk 1 cut to 1 step at an epoch's end: after it (version 2, 5 steps) 19 steps are left, 5 chunks more
    assert chunks_to_train(2, 5, 24, 4) == 7
    # two cuts of one step each: 8 chunks in all
    assert chunks_to_train(3, 6, 24, 4) == 3 + 5 == 8
    assert chunks_to_train(9, 24, 24, 4) == 9  # the run done: nothing more to score
