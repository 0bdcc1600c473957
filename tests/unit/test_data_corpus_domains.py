"""A corpus as a user holds it (issue 49): domains from the data paths when no record names one, every
file kind read (or named in one warning), the bad-record limit on a small corpus, checked before a run."""

from __future__ import annotations

import bz2
import gzip
import json
import logging
from pathlib import Path

import pytest
import zstandard

from d3ray.data import DataConfig, iter_documents, list_shards
from d3ray.data.corpus import prepare_corpus, resolve_corpus
from d3ray.data.ledger import BadRecordFractionError, BadRecordLedger, check_ledger
from d3ray.data.sample import write_sample_corpus
from d3ray.data.shards import list_corpus
from d3ray.errors import UserError
from tests.unit.test_data_bring_your_own import save_hf_dataset, write_jsonl, write_parquet

RECORDS = [{"text": f"record number {i} of the corpus"} for i in range(12)]
JSONL = "".join(json.dumps(r) + "\n" for r in RECORDS).encode()


def texts_of(path: Path, layout: str = "path") -> list[str]:
    return [d.text for s in list_shards(str(path)) for d in iter_documents(s, layout, None) if not d.is_bad]


# ---- domains from the data ---------------------------------------------------------------------------------
def test_a_plain_text_corpus_is_one_domain_named_after_its_folder_with_validation_in_it(tmp_path):
    write_jsonl(tmp_path / "train" / "a.jsonl", RECORDS)
    write_jsonl(tmp_path / "validation" / "a.jsonl", RECORDS[:4])
    corpus = prepare_corpus(DataConfig(train_paths=[str(tmp_path / "train")],
                                       validation_paths=[str(tmp_path / "validation")]))
    assert (corpus.data.layout, corpus.data.domains) == ("path", ["train"])
    assert [s.domain for s in corpus.validation] == ["train"]
    assert corpus.domains_line == ("domains: train (12 records), from the data paths' folder names "
                                   "(the records have no 'meta.redpajama_set_name')")
    docs = [d for s in corpus.validation for d in iter_documents(s, "path", corpus.data.domains)]
    assert len(docs) == 4 and {d.domain for d in docs} == {"train"} and not any(d.is_bad for d in docs)


def test_subfolders_are_domains_and_validation_pairs_with_them_by_name(tmp_path):
    write_jsonl(tmp_path / "mydata" / "web" / "a.jsonl", RECORDS)
    write_parquet(tmp_path / "mydata" / "code" / "b.parquet", {"text": [r["text"] for r in RECORDS]})
    save_hf_dataset(tmp_path / "held" / "web", {"text": ["held-out web"]})
    write_jsonl(tmp_path / "held" / "code" / "c.jsonl", [{"text": "held-out code"}])
    corpus = prepare_corpus(DataConfig(train_paths=[str(tmp_path / "mydata")],
                                       validation_paths=[str(tmp_path / "held")]))
    assert corpus.data.domains == ["code", "web"]
    assert {s.name: s.domain for s in corpus.validation} == {
        "held/code/c.jsonl": "code", "held/web/data-00000-of-00001.arrow": "web"}
    assert corpus.domains_line.startswith("domains: code (12 records), web (12 records), from the")


def test_paths_of_the_same_folder_name_are_made_unique_and_validation_pairs_by_order(tmp_path):
    for root in ("x", "y"):
        write_jsonl(tmp_path / root / "web" / f"{root}.jsonl", RECORDS)
    write_jsonl(tmp_path / "v1" / "first.jsonl", RECORDS[:2])
    write_jsonl(tmp_path / "v2" / "second.jsonl", RECORDS[:2])
    corpus = prepare_corpus(DataConfig(train_paths=[str(tmp_path / "x" / "web"), str(tmp_path / "y" / "web")],
                                       validation_paths=[str(tmp_path / "v1"), str(tmp_path / "v2")]))
    assert corpus.data.domains == ["web", "web_2"]
    assert [s.domain for s in corpus.train] == ["web", "web_2"]
    assert [s.domain for s in corpus.validation] == ["web", "web_2"]  # neither name matches: by order


def test_validation_paths_that_pair_neither_by_name_nor_by_order_are_refused(tmp_path):
    write_jsonl(tmp_path / "t" / "a" / "1.jsonl", RECORDS)
    write_jsonl(tmp_path / "t" / "b" / "1.jsonl", RECORDS)
    write_jsonl(tmp_path / "v" / "1.jsonl", RECORDS)
    data = DataConfig(train_paths=[str(tmp_path / "t")], validation_paths=[str(tmp_path / "v")])
    with pytest.raises(UserError, match=r"^data\.validation_paths: its folders \['v'\] pair with the training "
                                        r"domains \['a', 'b'\] .* neither by name nor by order \(1 against 2\)"):
        resolve_corpus(data)


def test_slimpajama_and_redpajama_folder_corpora_keep_their_domains(tmp_path):
    corpus = write_sample_corpus(tmp_path / "slim", train_docs=40, validation_docs=14, train_shards=2)
    slim = prepare_corpus(DataConfig(train_paths=[str(corpus / "train")],
                                     validation_paths=[str(corpus / "validation")]))
    assert slim.data.layout == "auto" and slim.data.domains == list(DataConfig().domains)
    assert all(s.domain == "" for s in slim.train)
    write_jsonl(tmp_path / "rp" / "c4-rp" / "a.jsonl", RECORDS)  # RedPajama-1T: the folder names the domain
    write_jsonl(tmp_path / "rp" / "arxiv" / "a.jsonl", RECORDS)
    rp = prepare_corpus(DataConfig(train_paths=[str(tmp_path / "rp")]))
    assert rp.data.layout == "auto" and rp.data.domains == list(DataConfig().domains)
    assert "RedPajamaArXiv (12 records), RedPajamaBook (0 records)" in rp.domains_line
    big = prepare_corpus(DataConfig(train_paths=[str(tmp_path / "rp")], min_records_before_check=10))
    assert "RedPajamaArXiv (12 records sampled), RedPajamaBook (0 records sampled)" in big.domains_line


def test_explicit_domains_are_not_replaced_by_the_paths(tmp_path):
    write_jsonl(tmp_path / "train" / "a.jsonl", RECORDS)
    assert resolve_corpus(DataConfig(train_paths=[str(tmp_path / "train")], layout="path"))[0].domains == ["train"]
    with pytest.raises(UserError, match=r"all of unknown domains \['train'\]"):
        resolve_corpus(DataConfig(train_paths=[str(tmp_path / "train")], domains=["web"]))


# ---- every file kind, and the files not read ---------------------------------------------------------------
def test_every_json_file_kind_is_read_and_other_files_are_named_in_one_warning(tmp_path, caplog):
    root = tmp_path / "mixed"
    root.mkdir()
    (root / "a.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(JSONL))
    (root / "b.JSONL").write_bytes(JSONL)
    (root / "c.json").write_text(json.dumps(RECORDS, indent=1))  # a top-level array, as datasets reads it
    (root / "d.ndjson").write_bytes(JSONL)
    (root / "e.jsonl.bz2").write_bytes(bz2.compress(JSONL))
    (root / "f.jsonl.zstd").write_bytes(zstandard.ZstdCompressor().compress(JSONL))
    (root / "g.json.gz").write_bytes(gzip.compress(JSONL))  # JSON Lines in a .json
    (root / "notes.txt").write_text("not records")
    (root / "table.csv").write_text("text\nx\n")
    with caplog.at_level(logging.WARNING):
        corpus = prepare_corpus(DataConfig(train_paths=[str(root)]))
    assert [s.name for s in corpus.train] == ["mixed/a.jsonl.zst", "mixed/b.JSONL", "mixed/c.json", "mixed/d.ndjson",
                                              "mixed/e.jsonl.bz2", "mixed/f.jsonl.zstd", "mixed/g.json.gz"]
    assert texts_of(root) == [r["text"] for r in RECORDS] * 7
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["data.train_paths: 2 file(s) not read, not of a kind d3ray reads (.jsonl/.json/.ndjson "
                        "(plain, .zst, .zstd, .gz or .bz2), .parquet, .arrow): mixed/notes.txt, mixed/table.csv; "
                        "convert them, or move them out of the data folder"]


def test_a_saved_datasets_metadata_files_are_part_of_it_not_records_nor_left_out(tmp_path):
    save_hf_dataset(tmp_path / "hfds", {"text": ["a", "b"]})
    listing = list_corpus(str(tmp_path / "hfds"))
    assert [s.name for s in listing.shards] == ["hfds/data-00000-of-00001.arrow"] and listing.ignored == []


def test_a_json_array_resumes_at_any_record_and_a_broken_one_is_one_bad_record(tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "arr.json").write_text(json.dumps(RECORDS))
    (shard,) = list_shards(str(tmp_path / "c"))
    docs = list(iter_documents(shard, "path", None))
    assert [d.line for d in docs] == list(range(1, 13))
    for doc in docs:
        rest = list(iter_documents(shard, "path", None, start=doc.position))
        assert [d.text for d in rest] == [d.text for d in docs[doc.line - 1:]]
    (tmp_path / "c" / "arr.json").write_text(json.dumps(RECORDS)[:-30])
    (bad,) = iter_documents(shard, "path", None)
    assert (bad.line, bad.bad_reason) == (1, "malformed_json")


def test_a_truncated_bz2_keeps_every_line_before_the_cut(tmp_path):
    (tmp_path / "c").mkdir()
    data = bz2.compress(JSONL)
    (tmp_path / "c" / "cut.jsonl.bz2").write_bytes(data[: len(data) - 20])
    (shard,) = list_shards(str(tmp_path / "c"))
    docs = list(iter_documents(shard, "path", None))
    assert docs[-1].bad_reason == "truncated_bz2"
    assert [d.text for d in docs[:-1]] == [r["text"] for r in RECORDS[: len(docs) - 1]]


# ---- the bad-record limit ----------------------------------------------------------------------------------
def tenth_bad(path: Path, n: int = 300) -> Path:
    """``n`` records, every 10th without ``text``: 10% bad."""
    return write_jsonl(path, [{"body": f"r{i}"} if i % 10 == 9 else {"text": f"record {i}"} for i in range(n)])


def test_a_small_corpus_over_the_bad_limit_stops_before_the_run_naming_the_file_reasons_and_lines(tmp_path):
    tenth_bad(tmp_path / "train" / "part.jsonl")
    with pytest.raises(BadRecordFractionError) as err:
        prepare_corpus(DataConfig(train_paths=[str(tmp_path / "train")]))
    assert str(err.value) == (
        "data.train_paths: all 300 records: 30 of 300 records are bad (10.00% > max_bad_fraction 1.00%); by reason "
        "{'missing_text': 30}; worst file train/part.jsonl: 30 bad of 300 records: missing_text x30 (first lines "
        "[10, 20, 30, 40, 50, 60, 70, 80, 90, 100]); fix or remove those records, or allow more with "
        "--data.max_bad_fraction")
    allowed = prepare_corpus(DataConfig(train_paths=[str(tmp_path / "train")], max_bad_fraction=0.1))
    assert allowed.data.domains == ["train"]


def test_the_first_records_of_a_larger_corpus_are_checked_and_the_run_end_checks_all_it_read(tmp_path):
    tenth_bad(tmp_path / "train" / "part.jsonl")
    with pytest.raises(BadRecordFractionError, match=r"^data\.train_paths: the first 50 records: 5 of 50"):
        prepare_corpus(DataConfig(train_paths=[str(tmp_path / "train")], min_records_before_check=50))
    ledger = BadRecordLedger()
    ledger.record_good("train/part.jsonl", 99)
    ledger.record_bad("train/part.jsonl", 100, "missing_text")
    check_ledger(ledger.to_dict(), 0.01)  # 1% is not over 1%
    ledger.record_bad("train/part.jsonl", 101, "missing_text")
    with pytest.raises(BadRecordFractionError, match=r"^the records the run read: 2 of 101 records are bad .*"
                                                     r"first lines \[100, 101\]\).*--sft\.max_bad_fraction$"):
        check_ledger(ledger.to_dict(), 0.01, "sft.max_bad_fraction")


def test_sft_paths_read_every_json_kind_and_name_the_other_files(tmp_path, caplog):
    from d3ray.data.sft import SftDataConfig
    from d3ray.data.sft_sequences import check_sft_sample, read_sft_records

    rows = [{"instruction": "Add the numbers.", "input": f"{a} and 3", "output": str(a + 3)} for a in range(6)]
    lines = "".join(json.dumps(r) + "\n" for r in rows).encode()
    (tmp_path / "sft").mkdir()
    (tmp_path / "sft" / "a.json").write_text(json.dumps(rows))
    (tmp_path / "sft" / "b.JSONL.BZ2").write_bytes(bz2.compress(lines))
    (tmp_path / "sft" / "c.csv").write_text("instruction,output\n")
    cfg = SftDataConfig(paths=[str(tmp_path / "sft")], format="alpaca")
    with caplog.at_level(logging.WARNING):
        check_sft_sample(cfg)
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        "sft.paths: 1 file(s) not read, not of a kind d3ray reads"]
    assert "sft/c.csv" in caplog.records[0].getMessage()
    records = read_sft_records(cfg.paths, fields=cfg.fields())
    assert [r.messages[-1][1] for r in records] == [str(a + 3) for a in range(6)] * 2


def test_upper_case_columnar_suffixes_are_read_as_their_kind(tmp_path):
    write_parquet(tmp_path / "c" / "a.PARQUET", {"text": ["x", "y"]})
    save_hf_dataset(tmp_path / "hf", {"text": ["z"]})
    (tmp_path / "hf" / "data-00000-of-00001.arrow").rename(tmp_path / "c" / "b.ARROW")
    assert texts_of(tmp_path / "c") == ["x", "y", "z"]
