"""The generated sample corpus, `inspect`, and the `d3ray data` sub-commands."""

import json

from d3ray.cli import main
from d3ray.data import DEFAULT_DOMAINS, inspect, list_shards, write_sample_corpus


def test_write_sample_corpus_same_seed_identical_bytes_other_seed_differs(tmp_path):
    a = write_sample_corpus(tmp_path / "a", seed=3, train_docs=100, validation_docs=20)
    b = write_sample_corpus(tmp_path / "b", seed=3, train_docs=100, validation_docs=20)
    c = write_sample_corpus(tmp_path / "c", seed=4, train_docs=100, validation_docs=20)
    files = sorted(p.relative_to(a) for p in a.rglob("*.jsonl.zst"))
    assert [str(f) for f in files] == [
        "train/chunk1/example_train_0.jsonl.zst",
        "train/chunk1/example_train_1.jsonl.zst",
        "train/chunk1/example_train_2.jsonl.zst",
        "train/chunk1/example_train_3.jsonl.zst",
        "validation/chunk1/example_holdout_0.jsonl.zst",
    ]
    assert all((a / f).read_bytes() == (b / f).read_bytes() for f in files)
    assert any((a / f).read_bytes() != (c / f).read_bytes() for f in files)


def test_sample_corpus_has_all_domains_in_both_splits_and_no_bad_records(tmp_path):
    root = write_sample_corpus(tmp_path, train_docs=120, validation_docs=14)
    for split, n_docs in (("train", 120), ("validation", 14)):
        report = inspect(str(root / split))
        assert set(report.domains) == set(DEFAULT_DOMAINS)
        assert report.total.records == n_docs and report.total.bad == 0
        assert report.total.tokens > 0


def test_inspect_counts_bad_records_per_shard_and_domain(tmp_path):
    (tmp_path / "c").mkdir()
    good = {"text": "one two three", "meta": {"redpajama_set_name": "RedPajamaC4"}}
    (tmp_path / "c" / "x.jsonl").write_text(json.dumps(good) + "\n{broken\n" + json.dumps(good) + "\n")
    report = inspect(str(tmp_path / "c"))
    assert {d: (c.records, c.bad, c.tokens) for d, c in report.domains.items()} == {
        "RedPajamaC4": (2, 0, 6),
        "(unknown)": (1, 1, 0),
    }
    assert report.bad_by_reason == {"c/x.jsonl": {"malformed_json": 1}}
    assert report.first_bad_lines == {"c/x.jsonl": {"malformed_json": [2]}}
    table = report.format_table()
    assert "c/x.jsonl: malformed_json x1 (first lines [2])" in table
    assert "words" in table


def test_cli_data_sample_then_inspect_json(tmp_path, capsys):
    assert (
        main(
            ["data", "sample", "--out", str(tmp_path / "s"), "--train-docs", "50", "--validation-docs", "14"]
        )
        == 0
    )
    assert len(list_shards(str(tmp_path / "s"))) == 5
    capsys.readouterr()
    assert main(["data", "inspect", str(tmp_path / "s" / "validation"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["total"]["records"] == 14 and out["total"]["bad"] == 0
    assert set(out["domains"]) == set(DEFAULT_DOMAINS)
    assert main(["data", "inspect", str(tmp_path / "s" / "train"), "--domains", "RedPajamaC4"]) == 0
    assert "unknown_domain" in capsys.readouterr().out


def test_write_sample_corpus_over_a_users_file_of_the_same_name_refuses_and_keeps_it(tmp_path):
    """A real SlimPajama download uses the same file names: `d3ray data sample --out` there must not overwrite it."""
    import pytest

    from d3ray.errors import UserError

    mine = tmp_path / "train" / "chunk1" / "example_train_0.jsonl.zst"
    mine.parent.mkdir(parents=True)
    mine.write_bytes(b"the user's real shard")
    with pytest.raises(UserError, match="example_train_0.jsonl.zst: exists and is not what d3ray would write"):
        write_sample_corpus(tmp_path, seed=3, train_docs=100, validation_docs=20)
    assert mine.read_bytes() == b"the user's real shard"
    again = write_sample_corpus(tmp_path / "own", seed=3, train_docs=100, validation_docs=20)
    assert write_sample_corpus(again, seed=3, train_docs=100, validation_docs=20) == again  # its own files: fine
