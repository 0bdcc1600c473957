"""The chunk stream on the real Ray Data reader: plain output equals today's behaviour, cursors seek
(nothing consumed is read again) and resume to identical chunks, mixed streams draw exactly once, the
shared reader exactly what a lane per domain draws."""

import gzip
import json
from collections import Counter

import numpy as np
import pytest
import zstandard

from d3ray.data import (
    DataConfig,
    SequencePacker,
    TokenizedDocument,
    TokenizerConfig,
    iter_documents,
    list_shards,
)
from d3ray.data.chunker import ChunkStream, make_batch
from d3ray.data.corpus_source import CorpusSource
from d3ray.data.tokenizer import encode_texts, load_backend_tokenizer, train_tokenizer
from tests.conftest import start_local_ray
from tests.data_oracle import reference_sequences

pytestmark = pytest.mark.ray

DOMAINS = ["RedPajamaC4", "RedPajamaGithub", "RedPajamaWikipedia"]


def record(i: int, domain: str) -> bytes:
    words = " ".join(f"w{(i * 7 + k) % 97}" for k in range(5 + (i * 13) % 40))
    return json.dumps({"text": f"doc {i} {words}", "meta": {"redpajama_set_name": domain}}).encode()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Four shards, one of each kind: multi-frame .zst (and a malformed line), single-frame .zst, .gz, .jsonl."""
    root = tmp_path_factory.mktemp("stream") / "train"
    root.mkdir()
    lines = [record(i, DOMAINS[2 if i % 20 == 7 else 1 if i % 4 == 1 else 0]) for i in range(480)]
    lines[37] = b"{not json"
    parts = [lines[k : k + 120] for k in range(0, 480, 120)]
    cctx = zstandard.ZstdCompressor()
    frames = [cctx.compress(b"\n".join(parts[0][k : k + 25]) + b"\n") for k in range(0, 120, 25)]
    (root / "a.jsonl.zst").write_bytes(b"".join(frames))
    (root / "b.jsonl.zst").write_bytes(cctx.compress(b"\n".join(parts[1]) + b"\n"))
    (root / "c.jsonl.gz").write_bytes(gzip.compress(b"\n".join(parts[2]) + b"\n"))
    (root / "d.jsonl").write_bytes(b"\n".join(parts[3]) + b"\n")
    cfg = DataConfig(seq_len=16, domains=DOMAINS, tokenize_batch_size=16, min_records_before_check=10_000,
                     tokenizer=TokenizerConfig(vocab_size=300, train_docs=100))
    shards = list_shards(str(root))
    return shards, cfg, str(train_tokenizer(shards, cfg, root.parent / "tokenizer"))


@pytest.fixture(scope="module")
def ray_local():
    return start_local_ray()


def old_shuffled(items, buffer, seed):
    """Today's (pre-cursor) streaming shuffle of d3ray.data.chunker, kept as the oracle."""
    rng = np.random.default_rng(seed)
    pool = []
    for item in items:
        pool.append(item)
        if len(pool) >= buffer:
            j = int(rng.integers(len(pool)))
            pool[j], pool[-1] = pool[-1], pool[j]
            yield pool.pop()
    while pool:
        j = int(rng.integers(len(pool)))
        pool[j], pool[-1] = pool[-1], pool[j]
        yield pool.pop()


def reference_chunks(shards, cfg, tok, B, L, buffer, seed, epochs):
    """Today's plain chunk stream without Ray: reader → tokenizer → packer one document at a time,
    the old shuffle, batches of B (tail dropped), chunks of L."""
    out = []
    for epoch in range(epochs):
        seqs = list(old_shuffled(reference_sequences(shards, cfg, tok), buffer, [seed, epoch]))
        batches = [make_batch(seqs[i : i + B], epoch) for i in range(0, len(seqs) - B + 1, B)]
        out += [batches[i : i + L] for i in range(0, len(batches), L)]
    return out


def take(stream, n):
    it = iter(stream)
    chunks = [next(it) for _ in range(n)]
    stream.close()
    return chunks


def test_plain_stream_equals_todays_behaviour_and_resumes_by_seeking(ray_local, corpus):
    shards, cfg, tok = corpus
    B, L, buffer, seed = 4, 3, 7, 11
    expected = reference_chunks(shards, cfg, tok, B, L, buffer, seed, epochs=2)
    stream = ChunkStream(CorpusSource(shards, cfg, tok), B, L, buffer, seed)
    chunks, got, prestarted_in_epoch = iter(stream), [], None
    while len(got) < len(expected):
        got.append(next(chunks))
        if prestarted_in_epoch is None and stream.lanes[None].prestarted:
            prestarted_in_epoch = got[-1].epoch
    stream.close()
    assert prestarted_in_epoch == 0  # epoch 1's reader was started while epoch 0 was still being read
    assert [[b.sample_ids for b in c.batches] for c in got] == [[b.sample_ids for b in c] for c in expected]
    assert all(np.array_equal(g.input_ids, e.input_ids) for c, x in zip(got, expected, strict=True)
               for g, e in zip(c.batches, x, strict=True))
    per_epoch = len(expected) // 2
    assert [c.epoch for c in got] == [0] * per_epoch + [1] * per_epoch

    # Resume inside each kind of shard (multi-frame zst, one-frame zst, gz, plain) and at the epoch start.
    records = [(i, d.line) for i, s in enumerate(shards) for d in iter_documents(s, cfg.layout, cfg.domains)]
    shard_of = [got[k].cursor["lane"]["reader"]["shard"] for k in range(per_epoch)]
    picks = [shard_of.index(i) + 2 for i in range(4)]  # a few chunks into each shard
    for k in picks:
        cursor = json.loads(json.dumps(got[k].cursor))
        reader = cursor["lane"]["reader"]
        assert reader["skip"] > 0 or reader["carry"]  # inside a document's sequences, with carried tokens
        source = CorpusSource(shards, cfg, tok)
        stream = ChunkStream(source, B, L, buffer, seed, cursor=cursor)
        resumed = take(stream, per_epoch + 1 - k)  # to the first chunk of epoch 1
        assert [[b.sample_ids for b in c.batches] for c in resumed] == [[b.sample_ids for b in c.batches]
                                                                         for c in got[k : per_epoch + 1]]
        # the resumed reader read exactly the records from the cursor's document on: none before it
        read = stream.lanes[None].records_read[0]
        assert read == sum(1 for s, ln in records if (s, ln) >= (reader["shard"], reader["position"][0]))
        assert read < len(records)


def test_mixed_stream_per_domain_lanes_exactly_once_and_resume(ray_local, corpus):
    shards, cfg, tok = corpus
    weights = {"RedPajamaC4": 0.25, "RedPajamaGithub": 0.25, "RedPajamaWikipedia": 0.5}

    def mixture(chunk_id):
        return weights

    B, L = 4, 2
    stream = ChunkStream(CorpusSource(shards, cfg, tok), B, L, shuffle_buffer=3, seed=2, mixture_for_chunk=mixture)
    chunks = take(stream, 40)  # 320 draws: Wikipedia's lane runs out and restarts
    drawn = [(d, sid) for c in chunks for b in c.batches for d, sid in zip(b.domains, b.sample_ids, strict=True)]
    assert len({sid for _, sid in drawn}) == len(drawn)
    assert stream.stats.domain_epochs.get("RedPajamaWikipedia", 0) >= 1
    # a completed domain epoch drew every sequence of that domain exactly once
    backend, eos = load_backend_tokenizer(tok)
    packer = SequencePacker(cfg.seq_len, eos)
    plain = []
    for shard in shards:
        for doc in iter_documents(shard, cfg.layout, cfg.domains):
            if not doc.is_bad:
                plain += packer.feed(TokenizedDocument(encode_texts(backend, [doc.text])[0], doc.domain, doc.shard,
                                                       doc.line))
    plain += packer.flush(cfg.domains)
    wiki = {s.sample_id for s in plain if s.domain == "RedPajamaWikipedia"}
    assert {sid.split("/", 1)[1] for d, sid in drawn if sid.startswith("0/") and d == "RedPajamaWikipedia"} == wiki
    assert Counter(d for d, _ in drawn) == stream.stats.domain_draws

    k = 23
    cursor = json.loads(json.dumps(chunks[k].cursor))
    resumed = take(ChunkStream(CorpusSource(shards, cfg, tok), B, L, shuffle_buffer=3, seed=2,
                               mixture_for_chunk=mixture, cursor=cursor), len(chunks) - k)
    assert [[b.sample_ids for b in c.batches] for c in resumed] == [[b.sample_ids for b in c.batches]
                                                                     for c in chunks[k:]]
    assert all(np.array_equal(g.input_ids, e.input_ids) for c, x in zip(resumed, chunks[k:], strict=True)
               for g, e in zip(c.batches, x.batches, strict=True))

    # The shared reader (the default, above) draws exactly what a lane per domain draws (span 0), and so
    # does one the mixture starves at once (span 1: Wikipedia, wanted at 0.5 against its natural ~5%,
    # moves to a lane of its own from its next sequence), resumed from a cursor after the move too.
    assert stream.domain_lanes.moved_to_lanes == []
    for span in (0, 1):
        other = ChunkStream(CorpusSource(shards, cfg, tok), B, L, shuffle_buffer=3, seed=2, mixture_for_chunk=mixture,
                            shared_span_blocks=span)
        again = take(other, len(chunks))
        assert [[b.sample_ids for b in c.batches] for c in again] == [[b.sample_ids for b in c.batches] for c in chunks]
        assert other.domain_lanes.moved_to_lanes[:1] == ([] if span == 0 else ["RedPajamaWikipedia"])
    cursor = json.loads(json.dumps(again[k].cursor))
    assert set(cursor["shared"]["skip"]) == set(DOMAINS) - set(other.domain_lanes.moved_to_lanes)
    resumed = take(ChunkStream(CorpusSource(shards, cfg, tok), B, L, shuffle_buffer=3, seed=2, mixture_for_chunk=mixture,
                               cursor=cursor, shared_span_blocks=1), len(chunks) - k)
    assert [[b.sample_ids for b in c.batches] for c in resumed] == [[b.sample_ids for b in c.batches]
                                                                     for c in chunks[k:]]


def test_columnar_corpus_with_its_own_keys_streams_as_the_reference_and_resumes_at_a_row(ray_local, tmp_path):
    """Parquet (row groups of 25) and a saved Hugging Face dataset (two Arrow files), the text and the domain
    under other names: the Ray stream equals the one-document-at-a-time reference, a null text is one
    counted bad row, and a cursor inside a row group resumes to the same chunks without the rows before it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    datasets = pytest.importorskip("datasets")
    rows = [json.loads(record(i, DOMAINS[2 if i % 20 == 7 else i % 2])) for i in range(300)]
    content = [r["text"] for r in rows]
    source = [r["meta"]["redpajama_set_name"] for r in rows]
    content[17] = None
    root = tmp_path / "train"
    root.mkdir()
    pq.write_table(pa.table({"content": content[:180], "source": source[:180]}), root / "a.parquet",
                   row_group_size=25)
    datasets.Dataset.from_dict({"content": content[180:], "source": source[180:]}).save_to_disk(
        str(root / "b"), num_shards=2)
    cfg = DataConfig(seq_len=16, domains=DOMAINS, layout="slimpajama", text_key="content", domain_key="source",
                     tokenize_batch_size=16, min_records_before_check=10_000,
                     tokenizer=TokenizerConfig(vocab_size=300, train_docs=100))
    shards = list_shards(str(root))
    assert [s.name for s in shards] == ["train/a.parquet", "train/b/data-00000-of-00002.arrow",
                                        "train/b/data-00001-of-00002.arrow"]
    tok = str(train_tokenizer(shards, cfg, tmp_path / "tokenizer"))
    B, L, buffer, seed = 4, 3, 5, 3
    expected = reference_chunks(shards, cfg, tok, B, L, buffer, seed, epochs=1)
    source_ = CorpusSource(shards, cfg, tok)
    got = take(ChunkStream(source_, B, L, buffer, seed), len(expected))
    assert [[b.sample_ids for b in c.batches] for c in got] == [[b.sample_ids for b in c] for c in expected]
    assert source_.ledger.bad_by_reason() == {"non_string_text": 1}
    assert source_.ledger.first_lines[("train/a.parquet", "non_string_text")] == [18]
    k = next(k for k, c in enumerate(got) if c.cursor["lane"]["reader"]["position"][2] >= 2)  # row group >= 2
    cursor = json.loads(json.dumps(got[k].cursor))
    stream = ChunkStream(CorpusSource(shards, cfg, tok), B, L, buffer, seed, cursor=cursor)
    resumed = take(stream, len(got) - k + 1)  # to the first chunk of epoch 1
    assert [[b.sample_ids for b in c.batches] for c in resumed[:-1]] == [[b.sample_ids for b in c.batches]
                                                                          for c in got[k:]]
    reader = cursor["lane"]["reader"]
    rows_before = [0, 180, 240][reader["shard"]] + reader["position"][0] - 1
    assert rows_before > 50 and stream.lanes[None].records_read[0] == 300 - rows_before  # none before the cursor
