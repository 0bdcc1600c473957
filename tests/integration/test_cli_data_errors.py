"""A data error reaches the user as a one-line error, not a Ray traceback: inside the running pipeline, or
before the run starts (then no run folder is left behind)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_cli_errors import _fails

pytestmark = pytest.mark.ray


@pytest.mark.slow
def test_cli_bad_records_over_the_limit_stop_the_run_with_the_worst_file(ray_cluster, capsys, tmp_path: Path) -> None:
    """The bad-record check fails inside the coordinator actor; the driver reports it as a user error. (The
    first 20 records, which the driver checks before the run, are good: the bad ones come after them.)"""
    import zstandard

    from d3ray.data.sample import write_sample_corpus

    corpus = write_sample_corpus(tmp_path / "corpus", train_docs=400, validation_docs=28, train_shards=1)
    (good_shard,) = (corpus / "train").rglob("*.jsonl.zst")
    lines = zstandard.ZstdDecompressor().stream_reader(good_shard.open("rb")).read().splitlines()
    broken = []
    for i, line in enumerate(lines[:40]):  # after the 20th, every third record is cut off: 6 of 46 are bad
        broken.append(line)
        if i >= 20 and i % 3 == 2:
            broken.append(b'{"text": "no closing brace"')
    train = tmp_path / "train" / "chunk1"
    train.mkdir(parents=True)
    # 40 documents make less than one chunk: the check at the end of the shard fires before chunk 0 is full.
    (train / "a_broken.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(b"\n".join(broken) + b"\n"))
    err = _fails([
        "pretrain", f"--output_dir={tmp_path / 'runs'}", f"--data.train_paths=[{train.parent}]",
        f"--data.validation_paths=[{corpus / 'validation'}]", "--data.max_bad_fraction=0.1", "--data.min_records_before_check=20",
        "--schedule.type=random", "--train.steps=8",
    ], capsys)
    assert err.startswith("d3ray pretrain: error: ") and "data.train_paths: the first" not in err  # not the driver's
    assert "records are bad" in err and "a_broken.jsonl.zst" in err
    assert not (tmp_path / "runs").exists()  # it stopped before its first step: the folder it made is gone
    # The tokenizer trained for this run is not left behind for a fixed rerun to reuse.
    assert not (tmp_path / "runs" / "d3ray-tiny" / "tokenizer").exists()


def tenth_bad_corpus(root: Path) -> Path:
    """The issue's corpus: 300 records, every 10th without ``text`` (10% bad; the limit is 1%)."""
    import json

    (root / "train").mkdir(parents=True)
    rows = [{"body": f"r{i}"} if i % 10 == 9 else {"text": f"record {i} of a small corpus"} for i in range(300)]
    (root / "train" / "part.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root / "train"


def test_cli_a_small_corpus_over_the_bad_limit_stops_before_the_run_and_leaves_no_folder(capsys, tmp_path) -> None:
    train = tenth_bad_corpus(tmp_path / "corpus")
    err = _fails(["pretrain", f"--output_dir={tmp_path / 'runs'}", f"--data.train_paths=[{train}]"], capsys)
    assert err == (
        "d3ray pretrain: error: data.train_paths: all 300 records: 30 of 300 records are bad (10.00% > "
        "max_bad_fraction 1.00%); by reason {'missing_text': 30}; worst file train/part.jsonl: 30 bad of 300 "
        "records: missing_text x30 (first lines [10, 20, 30, 40, 50, 60, 70, 80, 90, 100]); fix or remove those "
        "records, or allow more with --data.max_bad_fraction")
    assert not (tmp_path / "runs").exists()


def test_cli_a_mixer_on_a_one_domain_corpus_says_so_and_leaves_no_folder(capsys, tmp_path) -> None:
    train = tenth_bad_corpus(tmp_path / "corpus")
    err = _fails(["pretrain", f"--output_dir={tmp_path / 'runs'}", f"--data.train_paths=[{train}]",
                  "--data.max_bad_fraction=0.1", "--schedule.type=static"], capsys)
    assert err.startswith("d3ray pretrain: error: schedule.type: a domain mixer needs a corpus of at least two "
                          "domains; this corpus has ['train']")
    assert not (tmp_path / "runs").exists()
