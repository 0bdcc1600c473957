"""Chunk stream: batches of B, chunks of L, epochs, dropped tails counted, seeded shuffle."""

from dataclasses import dataclass

import numpy as np
import pytest

from d3ray.schedule.chunker import ChunkStream, shuffled
from d3ray.schedule.scheduler import random_order
from d3ray.train.config import TrainConfig
from d3ray.train.deepspeed_config import lr_factor


@dataclass(frozen=True)
class Seq:
    tokens: np.ndarray
    domain: str
    sample_id: str
    n_tokens: int


def make_source(n: int):
    def source(epoch):
        for i in range(n):
            yield Seq(np.full(4, i, dtype=np.int32), "d", f"s:{i}:0", 4)

    return source


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


def test_shuffled_is_seeded_permutation():
    a = list(shuffled(range(100), 16, [0, 1]))
    b = list(shuffled(range(100), 16, [0, 1]))
    c = list(shuffled(range(100), 16, [0, 2]))
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
