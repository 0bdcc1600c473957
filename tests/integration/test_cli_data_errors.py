"""A data error inside the running pipeline reaches the user as a one-line error, not a Ray traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_cli_errors import _fails

pytestmark = pytest.mark.ray


@pytest.mark.slow
def test_cli_bad_records_over_the_limit_stop_the_run_with_the_worst_file(capsys, tmp_path: Path) -> None:
    """The bad-record check fails inside the coordinator actor; the driver reports it as a user error."""
    import zstandard

    from d3ray.data.sample import write_sample_corpus

    corpus = write_sample_corpus(tmp_path / "corpus", train_docs=400, validation_docs=28, train_shards=1)
    (good_shard,) = (corpus / "train").rglob("*.jsonl.zst")
    lines = zstandard.ZstdDecompressor().stream_reader(good_shard.open("rb")).read().splitlines()
    broken = []
    for i, line in enumerate(lines[:40]):  # every third record is cut off: 1/4 of the records are bad
        broken.append(line)
        if i % 3 == 2:
            broken.append(b'{"text": "no closing brace"')
    train = tmp_path / "train" / "chunk1"
    train.mkdir(parents=True)
    # 40 documents make less than one chunk: the check at the end of the shard fires before chunk 0 is full.
    (train / "a_broken.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(b"\n".join(broken) + b"\n"))
    err = _fails([
        "pretrain", f"--output_dir={tmp_path / 'runs'}", f"--data.train_paths=[{train.parent}]",
        f"--data.validation_paths=[{corpus / 'validation'}]", "--data.max_bad_fraction=0.1", "--data.min_records_before_check=20",
        "--schedule.type=random", "--train.steps=8", "--ray.num_cpus=4",
    ], capsys)
    assert "d3ray pretrain: error:" in err and "records are bad" in err and "a_broken.jsonl.zst" in err
    # The tokenizer trained for this run is not left behind for a fixed rerun to reuse.
    assert not (tmp_path / "runs" / "d3ray-tiny" / "tokenizer").exists()
