"""Exactly-once accounting shared by the D3 integration tests (reads only a run directory)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import yaml

from d3ray.config import RunConfig
from d3ray.config_loading import from_dict
from d3ray.run_files import read_jsonl


def assert_exactly_once_in_logged_order(run_dir: Path, chunks: list, steps: int, L: int) -> dict:
    """Trained sample ids == produced ones (as multisets), and each chunk trained in its logged order."""
    cfg = from_dict(RunConfig, yaml.safe_load((run_dir / "config.yaml").read_text()))
    assert cfg.schedule.type_name == "d3"
    rows = [r for r in read_jsonl(run_dir / "samples.jsonl") if "sample_ids" in r]
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    trained = Counter(sid for r in rows for sid in r["sample_ids"])
    produced = Counter(sid for chunk in chunks for batch in chunk for sid in batch)
    assert trained == produced
    schedule = {r["chunk_id"]: r for r in read_jsonl(run_dir / "schedule_log.jsonl")}
    assert sorted(schedule) == list(range(len(chunks)))
    for r in rows:
        logged = schedule[r["chunk_id"]]["order"]
        assert sorted(logged) == list(range(L))
        assert tuple(r["sample_ids"]) == tuple(f"{sid}" for sid in chunks[r["chunk_id"]][logged[r["position"]]])
    return schedule


def produce_chunks(cfg: RunConfig, steps: int, mixtures: dict[int, dict[str, float]] | None = None
                   ) -> list[list[tuple[str, ...]]]:
    """The sample ids of the chunks (candidate windows) the coordinator produces for ``cfg`` (enough
    for ``steps``), read independently of any run through the same stream builder (needs Ray); a mixer's
    chunks are drawn with ``mixtures`` (chunk id → mixture, e.g. from the run's schedule log)."""
    from d3ray.data.chunk_stream import build_chunk_stream
    from d3ray.data.shards import list_shards

    stream = build_chunk_stream(list_shards(cfg.data.train_paths), cfg.data, cfg.data.tokenizer.path,
                                cfg.train.global_batch_size, cfg.schedule.window_batches(), cfg.schedule.shuffle_buffer,
                                cfg.seed, mixture_for_chunk=None if mixtures is None else mixtures.__getitem__)
    chunks: list[list[tuple[str, ...]]] = []
    for chunk in stream:
        chunks.append([b.sample_ids for b in chunk.batches])
        if len(chunks) * cfg.schedule.L >= steps:
            stream.close()
            return chunks
    return chunks


def assert_every_sample_accounted(run_dir: Path, chunks: list, steps: int) -> tuple[Counter, Counter]:
    """Every produced sample of the trained chunks is trained or skipped with a reason, exactly once;
    returns (trained, skipped) multisets of sample ids."""
    rows = read_jsonl(run_dir / "samples.jsonl")
    trained_rows = [r for r in rows if "sample_ids" in r]
    assert [r["step"] for r in trained_rows] == list(range(1, steps + 1))
    trained = Counter(sid for r in trained_rows for sid in r["sample_ids"])
    skipped = Counter(sid for r in rows if "skipped" in r for ids in r["skipped"].values() for sid in ids)
    assert not any(n > 1 for n in (trained + skipped).values()), "a sample trained or skipped twice"
    chunk_ids = sorted({r["chunk_id"] for r in trained_rows})
    produced = Counter(sid for c in chunk_ids for batch in chunks[c] for sid in batch)
    assert trained + skipped == produced
    return trained, skipped
