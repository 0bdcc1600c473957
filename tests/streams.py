"""Chunk streams over sequences held in memory, for tests that replay schedulers rather than the reader."""

from __future__ import annotations

from typing import Any


def memory_stream(sequences: list, batch_size: int, chunk_len: int, cursor: dict[str, Any] | None = None):
    """The chunk stream over ``sequences`` (a list of ``PackedSequence``), every epoch the same sequences;
    resumable from a ``Chunk.cursor`` like any ``IterableSource`` stream."""
    from d3ray.data.chunker import ChunkStream
    from d3ray.data.iterable_source import IterableSource

    return ChunkStream(IterableSource(lambda epoch, lane, ledger: iter(sequences)), batch_size, chunk_len, cursor=cursor)
