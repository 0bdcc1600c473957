"""The run's chunk stream: data (Ray Data reader, tokenizer, packer) → chunks, built inside the coordinator.

The assembly of the stages lives here, between the data package (which knows shards and tokens) and
the coordinator (which knows chunks and decisions): ``ChunkStream`` over ``iter_packed_sequences``,
with the chunk length the scheduler asks for (its candidate window).
"""

from __future__ import annotations

from typing import Any

from d3ray.data.config import DataConfig
from d3ray.schedule.chunker import ChunkStream


def build_chunk_stream(
    shards: list[Any], data: DataConfig, tokenizer_dir: str, batch_size: int, chunk_len: int,
    shuffle_buffer: int, seed: int,
) -> ChunkStream:
    """The run's deterministic chunk stream over Ray Data (needs Ray; built in the coordinator actor)."""
    from d3ray.data.pipeline import iter_packed_sequences
    from d3ray.data.records import BadRecordLedger

    ledger = BadRecordLedger()

    def sequences_for_epoch(epoch: int):
        return iter_packed_sequences(shards, data, tokenizer_dir, ledger)

    return ChunkStream(sequences_for_epoch, batch_size, chunk_len, shuffle_buffer, seed, ledger=ledger)
