"""Exactly-once accounting shared by the D3 integration tests (reads only a run directory)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import yaml

from d3ray.config import RunConfig
from d3ray.config_loading import from_dict
from d3ray.run_files import read_jsonl


def assert_exactly_once_in_logged_order(run_dir: Path, chunks: list, steps: int, chunk_len: int) -> dict:
    """Trained sample ids == produced ones (as multisets), and each chunk trained in its logged order."""
    cfg = from_dict(RunConfig, yaml.safe_load((run_dir / "config.yaml").read_text()))
    assert cfg.schedule.type_name == "d3"
    rows = read_jsonl(run_dir / "samples.jsonl")
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    trained = Counter(sid for r in rows for sid in r["sample_ids"])
    produced = Counter(sid for chunk in chunks for batch in chunk for sid in batch)
    assert trained == produced
    schedule = {r["chunk_id"]: r for r in read_jsonl(run_dir / "schedule_log.jsonl")}
    assert sorted(schedule) == list(range(len(chunks)))
    for r in rows:
        logged = schedule[r["chunk_id"]]["order"]
        assert sorted(logged) == list(range(chunk_len))
        assert tuple(r["sample_ids"]) == tuple(f"{sid}" for sid in chunks[r["chunk_id"]][logged[r["position"]]])
    return schedule


def produce_chunks(cfg: RunConfig, steps: int) -> list[list[tuple[str, ...]]]:
    """The sample ids of the chunks the coordinator produces for ``cfg`` (enough for ``steps``),
    read independently of any run through the same stream builder (needs Ray)."""
    from d3ray.data.shards import list_shards
    from d3ray.train.run import build_chunk_stream

    stream = build_chunk_stream(list_shards(cfg.data.train_paths), cfg.data, cfg.data.tokenizer.path,
                                cfg.train.global_batch_size, cfg.schedule.L, cfg.schedule.shuffle_buffer, cfg.seed)
    chunks: list[list[tuple[str, ...]]] = []
    for chunk in stream:
        chunks.append([b.sample_ids for b in chunk.batches])
        if len(chunks) * cfg.schedule.L >= steps:
            return chunks
    return chunks
