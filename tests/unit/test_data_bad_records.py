"""Bad records: each kind is counted at its line, and every good line of the file is kept."""

import gzip
import json

import pytest
import zstandard

from d3ray.data import BadRecordFractionError, BadRecordLedger, Shard, iter_documents, list_shards

DOMAINS = ["RedPajamaC4", "RedPajamaGithub"]


def good(i, domain="RedPajamaC4"):
    return json.dumps({"text": f"good document {i}", "meta": {"redpajama_set_name": domain}}).encode()


def read(path, layout="slimpajama", max_bytes=1 << 20):
    (shard,) = list_shards(str(path))
    return list(iter_documents(shard, layout, DOMAINS, max_bytes))


def test_reader_each_bad_kind_counted_at_its_line_and_good_lines_kept(tmp_path):
    lines = [
        good(1),
        b'{"text": "no closing brace"',  # 2 malformed_json
        json.dumps({"meta": {"redpajama_set_name": "RedPajamaC4"}}).encode(),  # 3 missing_text
        json.dumps({"text": 42, "meta": {"redpajama_set_name": "RedPajamaC4"}}).encode(),  # 4 non_string_text
        json.dumps({"text": "", "meta": {"redpajama_set_name": "RedPajamaC4"}}).encode(),  # 5 empty_text
        b'{"text": "caf\xe9 latin-1", "meta": {"redpajama_set_name": "RedPajamaC4"}}',  # 6 undecodable_bytes
        good(7, "RedPajamaGithub"),
        json.dumps(
            {"text": "x", "meta": {"redpajama_set_name": "RedPajamaMars"}}
        ).encode(),  # 8 unknown_domain
        json.dumps({"text": "no meta"}).encode(),  # 9 unknown_domain (slimpajama layout needs the set name)
        b'{"text": "lone \\ud800 surrogate", "meta": {"redpajama_set_name": "RedPajamaC4"}}',  # 10 undecodable
        b"[1, 2, 3]",  # 11 malformed_json (not an object)
        b"   ",  # 12 blank: not a record
        json.dumps(
            {"text": "y" * 300, "meta": {"redpajama_set_name": "RedPajamaC4"}}
        ).encode(),  # 13 oversized
        good(14),
        json.dumps(
            {"text": " \n\t ", "meta": {"redpajama_set_name": "RedPajamaC4"}}
        ).encode(),  # 15 empty_text
        good(16),  # no trailing newline
    ]
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"\n".join(lines))
    docs = read(path, max_bytes=200)
    assert [(d.line, d.bad_reason) for d in docs if d.is_bad] == [
        (2, "malformed_json"),
        (3, "missing_text"),
        (4, "non_string_text"),
        (5, "empty_text"),
        (6, "undecodable_bytes"),
        (8, "unknown_domain"),
        (9, "unknown_domain"),
        (10, "undecodable_bytes"),
        (11, "malformed_json"),
        (13, "oversized_record"),
        (15, "empty_text"),
    ]
    assert [(d.line, d.text, d.domain) for d in docs if not d.is_bad] == [
        (1, "good document 1", "RedPajamaC4"),
        (7, "good document 7", "RedPajamaGithub"),
        (14, "good document 14", "RedPajamaC4"),
        (16, "good document 16", "RedPajamaC4"),
    ]
    ledger = BadRecordLedger()
    for d in docs:
        ledger.record(d)
    assert ledger.bad_by_reason() == {
        "empty_text": 2,
        "malformed_json": 2,
        "missing_text": 1,
        "non_string_text": 1,
        "oversized_record": 1,
        "undecodable_bytes": 2,
        "unknown_domain": 2,
    }
    assert docs[0].shard == f"{tmp_path.name}/bad.jsonl"
    assert ledger.first_lines[(docs[0].shard, "unknown_domain")] == [8, 9]
    assert (ledger.total_good, ledger.total_bad) == (4, 11)


def test_reader_truncated_zstd_keeps_every_line_before_the_cut(tmp_path):
    records = [good(i) for i in range(20000)]  # ~1 MB: several zstd blocks, so a cut leaves whole blocks
    blob = zstandard.ZstdCompressor(level=3).compress(b"\n".join(records) + b"\n")
    path = tmp_path / "cut.jsonl.zst"
    path.write_bytes(blob[: len(blob) * 2 // 3])
    docs = read(path)
    good_docs, bad_docs = docs[:-1], docs[-1:]
    assert len(good_docs) > 5000
    assert [d.text for d in good_docs] == [f"good document {i}" for i in range(len(good_docs))]
    assert [(d.line, d.bad_reason) for d in bad_docs] == [(len(good_docs) + 1, "truncated_zstd")]


def test_reader_truncated_second_zstd_frame_keeps_the_whole_first_frame(tmp_path):
    cctx = zstandard.ZstdCompressor(level=3)
    first = cctx.compress(b"\n".join(good(i) for i in range(10)) + b"\n")
    second = cctx.compress(b"\n".join(good(i) for i in range(10, 20)) + b"\n")
    path = tmp_path / "frames.jsonl.zst"
    path.write_bytes(first + second)
    assert [d.line for d in read(path)] == list(range(1, 21))  # both frames, one stream
    path.write_bytes(first + second[: len(second) // 2])
    docs = read(path)
    assert [d.text for d in docs[:10]] == [f"good document {i}" for i in range(10)]
    assert [(d.line, d.bad_reason) for d in docs[10:]] == [(11, "truncated_zstd")]


def test_reader_gzip_read_and_truncation_counted(tmp_path):
    data = b"\n".join(good(i) for i in range(5000)) + b"\n"
    path = tmp_path / "part.jsonl.gz"
    path.write_bytes(gzip.compress(data))
    assert len(read(path)) == 5000
    blob = gzip.compress(data)
    path.write_bytes(blob[: len(blob) // 2])
    docs = read(path)
    assert docs[-1].bad_reason == "truncated_gzip"
    assert [d.text for d in docs[:-1]] == [f"good document {i}" for i in range(len(docs) - 1)]


def test_reader_redpajama_1t_unknown_folder_is_unknown_domain(tmp_path):
    (tmp_path / "misc").mkdir()
    (tmp_path / "misc" / "x.jsonl").write_text('{"text": "a"}\n')
    (tmp_path / "github").mkdir()
    (tmp_path / "github" / "y.jsonl").write_text('{"text": "b"}\n')
    docs = [
        d for s in list_shards(str(tmp_path)) for d in iter_documents(s, "redpajama_1t", DOMAINS, 1 << 20)
    ]
    assert [(d.shard.split("/", 1)[1], d.domain, d.bad_reason) for d in docs] == [
        ("github/y.jsonl", "RedPajamaGithub", ""),
        ("misc/x.jsonl", "misc", "unknown_domain"),
    ]


def test_ledger_check_names_the_worst_file():
    ledger = BadRecordLedger()
    ledger.record_good("a.jsonl", 99)
    ledger.record_bad("a.jsonl", 5, "malformed_json")
    ledger.record_good("b.jsonl", 1)
    ledger.record_bad("b.jsonl", 2, "empty_text")
    ledger.record_bad("b.jsonl", 3, "empty_text")
    assert ledger.bad_fraction == pytest.approx(3 / 103)
    ledger.check(0.05)
    with pytest.raises(
        BadRecordFractionError,
        match=r"worst file b\.jsonl: 2 bad of 3 records: empty_text x2 \(first lines \[2, 3\]\)",
    ):
        ledger.check(0.02)


def test_ledger_merge_adds_counts_and_keeps_first_lines():
    a, b = BadRecordLedger(keep_lines=3), BadRecordLedger(keep_lines=3)
    a.record_good("s", 10)
    for line in (7, 9):
        a.record_bad("s", line, "malformed_json")
    for line in (1, 8):
        b.record_bad("s", line, "malformed_json")
    b.record_bad("t", 4, "unknown_domain")
    a.merge(b)
    assert a.bad_by_reason() == {"malformed_json": 4, "unknown_domain": 1}
    assert a.first_lines[("s", "malformed_json")] == [1, 7, 8]
    restored = BadRecordLedger.from_dict(a.to_dict(), keep_lines=3)
    assert restored.to_dict() == a.to_dict()


def test_shard_dict_round_trip():
    shard = Shard(uri="memory://c/x.jsonl", name="c/x.jsonl", folder="c")
    assert Shard.from_dict(shard.to_dict()) == shard


def test_per_domain_lanes_keep_every_record_exactly_once(tmp_path):
    """Every record (good, bad with a domain, bad without one, unknown domain, a text quoting the
    set-name key) is kept by exactly one lane; the others skip it."""
    rows = [
        json.dumps({"text": "c4 text", "meta": {"redpajama_set_name": "RedPajamaC4"}}),
        json.dumps({"text": 'quotes "redpajama_set_name": "RedPajamaBook"', "meta": {"redpajama_set_name": "RedPajamaC4"}}),
        json.dumps({"meta": {"redpajama_set_name": "RedPajamaGithub"}}),  # missing text: GitHub's
        "{not json",
        json.dumps({"text": "x", "meta": {"redpajama_set_name": "RedPajamaMars"}}),  # unknown domain
        json.dumps({"text": "gh", "meta": {"redpajama_set_name": "RedPajamaGithub"}}),
        json.dumps({"meta": {"redpajama_set_name": "RedPajamaC4"}, "text": "meta first"}),
    ]
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(rows) + "\n")
    (shard,) = list_shards(str(path))
    everything = [(d.line, d.bad_reason) for d in iter_documents(shard, "slimpajama", DOMAINS, 1 << 20)]
    kept = {lane: [(d.line, d.bad_reason) for d in iter_documents(shard, "slimpajama", DOMAINS, 1 << 20,
                                                                   lane=lane, unattributed_lane=DOMAINS[0])]
            for lane in DOMAINS}
    assert sorted(x for v in kept.values() for x in v) == sorted(everything)
    # C4 (DOMAINS[0]) also keeps the records of no known domain
    assert kept["RedPajamaC4"] == [(1, ""), (2, ""), (4, "malformed_json"), (5, "unknown_domain"), (7, "")]
    assert kept["RedPajamaGithub"] == [(3, "missing_text"), (6, "")]
