"""The run's chunk stream: data (Ray Data reader, tokenizer, packer) → chunks, built inside the coordinator.

The assembly of the stages lives here, between the data package (which knows shards and tokens) and
the coordinator (which knows chunks and decisions): ``ChunkStream`` over a ``CorpusSource``,
with the chunk length the scheduler asks for (its candidate window).
"""

from __future__ import annotations

from typing import Any

from d3ray.data.config import DataConfig
from d3ray.schedule.chunker import ChunkStream


def build_chunk_stream(
    shards: list[Any], data: DataConfig, tokenizer_dir: str, batch_size: int, chunk_len: int,
    shuffle_buffer: int, seed: int, cursor: dict[str, Any] | None = None,
    mixture_for_chunk: Any = None,
) -> ChunkStream:
    """The run's deterministic chunk stream over Ray Data (needs Ray; built in the coordinator actor),
    from ``cursor`` (a ``Chunk.cursor``) when given, drawn by domain when ``mixture_for_chunk`` is given."""
    from d3ray.data.stream import CorpusSource

    source = CorpusSource(shards, data, tokenizer_dir)
    return ChunkStream(source, batch_size, chunk_len, shuffle_buffer, seed,
                       mixture_for_chunk=mixture_for_chunk, cursor=cursor)
