"""The run's chunk stream: data → chunks, built inside the coordinator.

The assembly of the stages lives here, between the data package (which knows shards, records and
tokens) and the coordinator (which knows chunks and decisions): ``ChunkStream`` over the packed
pre-training sequences of the Ray Data reader (``iter_packed_sequences``), or over SFT records with
their loss masks (``iter_sft_sequences``, the task as the domain), with the chunk length the
scheduler asks for (its candidate window).
"""

from __future__ import annotations

from typing import Any

from d3ray.data.config import DataConfig
from d3ray.data.sft import SftDataConfig
from d3ray.schedule.chunker import ChunkStream


def build_chunk_stream(
    shards: list[Any], data: DataConfig, tokenizer_dir: str, batch_size: int, chunk_len: int,
    shuffle_buffer: int, seed: int, sft: SftDataConfig | None = None,
) -> ChunkStream:
    """The run's deterministic chunk stream (needs Ray for pre-training data; built in the coordinator)."""
    from d3ray.data.records import BadRecordLedger

    ledger = BadRecordLedger()

    def sequences_for_epoch(epoch: int):
        if sft is not None:
            from d3ray.data.sft_sequences import iter_sft_sequences

            return iter_sft_sequences(sft, tokenizer_dir, ledger)
        from d3ray.data.pipeline import iter_packed_sequences

        return iter_packed_sequences(shards, data, tokenizer_dir, ledger)

    return ChunkStream(sequences_for_epoch, batch_size, chunk_len, shuffle_buffer, seed, ledger=ledger)
