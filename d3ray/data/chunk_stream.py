"""The run's chunk stream: data → chunks, built inside the coordinator (d3ray.schedule).

The assembly of the stages lives here, between the data package (which knows shards, records and
tokens) and the coordinator (which knows chunks and decisions): ``ChunkStream`` over a
``CorpusSource`` (the packed pre-training sequences of the Ray Data reader: resumable by seeking,
mixable by domain), or over SFT records with their loss masks (``iter_sft_sequences``, the task as
the domain, through an ``IterableSource``: mixable by task, one lane per task of the training files),
with the chunk length the scheduler asks for (its candidate window).
"""

from __future__ import annotations

from typing import Any

from d3ray.data.chunker import ChunkStream
from d3ray.data.config import DataConfig
from d3ray.data.sft import SftDataConfig
from d3ray.data.source import SequenceSource


def build_chunk_stream(
    shards: list[Any], data: DataConfig, tokenizer_dir: str, batch_size: int, chunk_len: int,
    shuffle_buffer: int, seed: int, sft: SftDataConfig | None = None, cursor: dict[str, Any] | None = None,
    mixture_for_chunk: Any = None,
) -> ChunkStream:
    """The run's deterministic chunk stream (needs Ray for pre-training data; built in the coordinator),
    from ``cursor`` (a ``Chunk.cursor``) when given, drawn by domain when ``mixture_for_chunk`` is given."""
    from d3ray.data.corpus_source import CorpusSource
    from d3ray.data.iterable_source import IterableSource
    from d3ray.data.ledger import BadRecordLedger

    ledger = BadRecordLedger()
    if sft is not None:
        from d3ray.data.sft_sequences import iter_sft_sequences, sft_task_counts

        def sft_epoch(epoch: int, task: str | None, counts: BadRecordLedger) -> Any:
            return iter_sft_sequences(sft, tokenizer_dir, counts, task=task)

        source: SequenceSource = IterableSource(sft_epoch, ledger, domains=lambda: list(sft_task_counts(sft)))
    else:
        source = CorpusSource(shards, data, tokenizer_dir, ledger)
    return ChunkStream(source, batch_size, chunk_len, shuffle_buffer, seed,
                       mixture_for_chunk=mixture_for_chunk, cursor=cursor)
