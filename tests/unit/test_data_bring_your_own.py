"""Any corpus: JSONL with other text and domain keys, parquet, a saved Hugging Face dataset, a local
HF dataset folder; domains from the records, the folders or the files; every record accounted for;
bad input stops in one line naming the field, the file and the fix, before any Ray work."""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from d3ray.data import BadRecordLedger, DataConfig, iter_documents, list_shards
from d3ray.data.corpus import field_shards, resolve_corpus
from d3ray.errors import DataPathError, UserError


def write_jsonl(path: Path, rows: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def write_parquet(path: Path, columns: dict, row_group_size: int = 3) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path, row_group_size=row_group_size)
    return path


def save_hf_dataset(path: Path, columns: dict) -> Path:
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict(columns).save_to_disk(str(path))
    return path


def read_all(path: Path, layout: str, domains=None, **keys) -> list:
    return [d for s in list_shards(str(path)) for d in iter_documents(s, layout, domains, 1 << 20, **keys)]


def summary(docs) -> list[tuple]:
    return [(d.shard, d.line, d.domain, d.text, d.bad_reason) for d in docs]


# ---- records: keys, formats, bad rows --------------------------------------------------------------------
def test_jsonl_custom_text_and_nested_domain_keys_read_with_bad_records_at_their_lines(tmp_path):
    rows = [{"body": "first", "info": {"source": "web"}},
            {"body": None, "info": {"source": "web"}},  # 2 non_string_text (null)
            {"info": {"source": "code"}},  # 3 missing_text, keeps its domain for reports
            {"body": "fourth", "info": {"source": "books"}},  # 4 unknown_domain
            {"body": "fifth", "info": {"source": "code"}},
            {"body": "dotted key wins", "info.source": "code", "info": {"source": "web"}}]
    path = write_jsonl(tmp_path / "c" / "part.jsonl", rows)
    docs = read_all(path, "slimpajama", ["web", "code"], text_key="body", domain_key="info.source")
    assert [(d.line, d.domain, d.text, d.bad_reason) for d in docs] == [
        (1, "web", "first", ""), (2, "web", "", "non_string_text"), (3, "code", "", "missing_text"),
        (4, "books", "", "unknown_domain"), (5, "code", "fifth", ""), (6, "code", "dotted key wins", "")]
    assert docs[1].detail == "body is null" and "keys: ['info']" in docs[2].detail
    ledger = BadRecordLedger()
    for doc in docs:
        ledger.record(doc)
    assert ledger.total_good == 3 and ledger.bad_by_reason() == {
        "missing_text": 1, "non_string_text": 1, "unknown_domain": 1}


def test_parquet_rows_are_records_with_row_positions_and_counted_bad_rows(tmp_path):
    path = write_parquet(tmp_path / "c" / "p.parquet", {
        "content": ["a b", None, "c d", " ", "e f", "g h", "i j"],
        "meta": [{"redpajama_set_name": "RedPajamaC4"}] * 6 + [{"redpajama_set_name": "RedPajamaBook"}]})
    docs = read_all(path, "slimpajama", ["RedPajamaC4", "RedPajamaBook"], text_key="content")
    assert summary(docs) == [
        ("c/p.parquet", 1, "RedPajamaC4", "a b", ""), ("c/p.parquet", 2, "RedPajamaC4", "", "non_string_text"),
        ("c/p.parquet", 3, "RedPajamaC4", "c d", ""), ("c/p.parquet", 4, "RedPajamaC4", "", "empty_text"),
        ("c/p.parquet", 5, "RedPajamaC4", "e f", ""), ("c/p.parquet", 6, "RedPajamaC4", "g h", ""),
        ("c/p.parquet", 7, "RedPajamaBook", "i j", "")]
    # line = row number, offset = row index, frame = row group (3 rows each) and its first row
    assert [d.position.to_list() for d in docs[2:5]] == [[3, 2, 0, 0], [4, 3, 1, 3], [5, 4, 1, 3]]


def test_parquet_int_text_column_is_non_string_text_per_row(tmp_path):
    path = write_parquet(tmp_path / "c" / "ints.parquet", {"text": [1, 2]})
    docs = read_all(path, "file", None)
    assert [(d.line, d.bad_reason, d.detail) for d in docs] == [
        (1, "non_string_text", "text is a int"), (2, "non_string_text", "text is a int")]


def test_saved_hf_dataset_folder_lists_its_arrow_files_and_reads_them(tmp_path):
    save_hf_dataset(tmp_path / "corpus" / "books", {"text": ["once upon a time", "", "the end"]})
    shards = list_shards(str(tmp_path / "corpus"))
    assert [s.name for s in shards] == ["corpus/books/data-00000-of-00001.arrow"] and shards[0].columnar
    docs = read_all(tmp_path / "corpus", "folder", ["books"])
    assert [(d.line, d.domain, d.bad_reason) for d in docs] == [(1, "books", ""), (2, "books", "empty_text"),
                                                                 (3, "books", "")]


def test_local_hf_dataset_directory_of_parquet_with_a_dataset_card(tmp_path):
    root = tmp_path / "my_dataset"
    write_parquet(root / "data" / "train-00000-of-00002.parquet", {"text": ["a", "b"]})
    write_parquet(root / "data" / "train-00001-of-00002.parquet", {"text": ["c"]})
    (root / "README.md").write_text("---\nconfigs:\n- config_name: default\n---\n# card\n")
    shards = field_shards([str(root)], "data.train_paths")
    assert [s.stem for s in shards] == ["train-00000-of-00002", "train-00001-of-00002"]
    assert [d.text for s in shards for d in iter_documents(s, "folder", ["data"])] == ["a", "b", "c"]


def test_every_row_position_resumes_the_rest_of_a_columnar_shard(tmp_path):
    path = write_parquet(tmp_path / "c" / "p.parquet", {"text": [f"row {i}" if i % 4 else None for i in range(11)]})
    hf = save_hf_dataset(tmp_path / "hf", {"text": [f"row {i}" for i in range(5)]})
    for shard in (*list_shards(str(path)), *list_shards(str(hf))):
        docs = list(iter_documents(shard, "file", None))
        for k, doc in enumerate(docs):
            rest = iter_documents(shard, "file", None, start=doc.position)
            assert summary(rest) == summary(docs[k:]), (shard.name, k)


def test_per_domain_lanes_keep_every_row_and_line_exactly_once(tmp_path):
    domains = ["web", "code"]
    labels = ["web", "code", None, "mars", "code", "web", "code"]
    write_parquet(tmp_path / "c" / "p.parquet", {"txt": ["x", "y", "z", "w", None, "v", "u"],
                                                 "src": labels})
    write_jsonl(tmp_path / "c" / "q.jsonl", [{"txt": f"t{i}", "src": lab} for i, lab in enumerate(labels)]
                + ['{"txt": "quotes \\"src\\": \\"web\\"", "src": "code"}', "{broken"])
    for shard in list_shards(str(tmp_path / "c")):
        keys = {"text_key": "txt", "domain_key": "src"}
        everything = [(d.line, d.bad_reason) for d in iter_documents(shard, "slimpajama", domains, **keys)]
        kept = {lane: [(d.line, d.bad_reason) for d in iter_documents(
            shard, "slimpajama", domains, lane=lane, unattributed_lane=domains[0], **keys)] for lane in domains}
        assert sorted(x for v in kept.values() for x in v) == sorted(everything), shard.name
        assert all(d.domain == "code" for d in iter_documents(shard, "slimpajama", domains, lane="code", **keys))


def test_file_and_folder_layouts_name_domains_and_a_lane_skips_the_other_files(tmp_path):
    write_jsonl(tmp_path / "c" / "web.jsonl", [{"text": "w"}])
    write_parquet(tmp_path / "c" / "code.parquet", {"text": ["c1", "c2"]})
    docs = read_all(tmp_path / "c", "file", ["web", "code"])
    assert [(d.domain, d.text) for d in docs] == [("code", "c1"), ("code", "c2"), ("web", "w")]
    (code, web) = list_shards(str(tmp_path / "c"))
    assert list(iter_documents(code, "file", ["web", "code"], lane="web")) == []
    # a file of no known domain is read (and counted) by the unattributed lane only
    assert [(d.domain, d.bad_reason) for d in iter_documents(code, "file", ["web"], lane="web",
                                                             unattributed_lane="web")] == [("code", "unknown_domain")] * 2
    assert [d.domain for d in read_all(tmp_path / "c", "folder", None)] == ["c", "c", "c"]


def test_cut_parquet_and_cut_arrow_stream_are_one_corrupt_record_after_the_rows_before(tmp_path):
    path = write_parquet(tmp_path / "c" / "p.parquet", {"text": ["a", "b"]})
    path.write_bytes(path.read_bytes()[:-20])  # the footer is gone: no row can be read
    assert [(d.line, d.bad_reason) for d in read_all(path, "file", None)] == [(1, "corrupt_columnar")]
    hf = save_hf_dataset(tmp_path / "hf", {"text": [f"doc {i}" for i in range(2500)]})  # batches of 1000 rows
    (arrow,) = hf.glob("*.arrow")
    arrow.write_bytes(arrow.read_bytes()[: int(arrow.stat().st_size * 0.6)])
    docs = read_all(arrow, "file", None)
    assert [(d.line, d.bad_reason) for d in docs if d.is_bad] == [(1001, "corrupt_columnar")]
    assert [d.text for d in docs if not d.is_bad] == [f"doc {i}" for i in range(1000)]


# ---- the corpus a run resolves: domains, and bad input in one line ----------------------------------------
def test_resolve_corpus_derives_the_domains_from_the_folders_in_listing_order(tmp_path):
    write_jsonl(tmp_path / "mydata" / "web" / "a.jsonl", [{"content": "web text"}])
    write_parquet(tmp_path / "mydata" / "code" / "b.parquet", {"content": ["code text"]})
    save_hf_dataset(tmp_path / "mydata" / "books", {"content": ["book text"]})
    data = DataConfig(train_paths=[str(tmp_path / "mydata")], layout="folder", domains=[], text_key="content")
    resolved, train, validation = resolve_corpus(data)
    assert resolved.domains == ["books", "code", "web"] and len(train) == 3 and validation == []
    by_file = DataConfig(train_paths=[str(tmp_path / "mydata" / "web")], layout="file", domains=[], text_key="content")
    assert resolve_corpus(by_file)[0].domains == ["a"]


def test_domains_derived_from_the_corpus_need_a_layout_that_names_them():
    with pytest.raises(ValueError, match=r"data\.domains=\[\] .* not data\.layout=auto.*--data\.layout=folder"):
        DataConfig(domains=[])
    with pytest.raises(ValueError, match=r"data\.text_key must be a field name"):
        DataConfig(text_key="meta.")


def test_validation_folders_named_unlike_the_training_ones_are_refused_naming_both(tmp_path):
    write_jsonl(tmp_path / "train" / "web" / "a.jsonl", [{"text": "t"}])
    write_jsonl(tmp_path / "valid_set" / "webs" / "a.jsonl", [{"text": "v"}])
    data = DataConfig(train_paths=[str(tmp_path / "train")], validation_paths=[str(tmp_path / "valid_set")],
                      layout="folder", domains=[])
    with pytest.raises(UserError, match=r"^data\.validation_paths: .* of domains \['webs'\], not among the "
                                        r"training corpus' \['web'\]"):
        resolve_corpus(data)


def test_a_path_that_does_not_exist_names_the_field_and_the_path(tmp_path):
    data = DataConfig(train_paths=[str(tmp_path / "nope")])
    with pytest.raises(DataPathError, match=rf"^data\.train_paths: no such file or folder: '{tmp_path}/nope'"):
        resolve_corpus(data)


def test_a_text_key_missing_from_every_sampled_record_names_data_text_key(tmp_path):
    write_jsonl(tmp_path / "c" / "web.jsonl", [{"content": "x"}] * 3)
    with pytest.raises(UserError, match=r"^data\.text_key: none of the first 3 records .* has the field 'text' "
                                        r"\(first: c/web\.jsonl line 1, .*keys: \['content'\]\); set --data\.text_key="):
        resolve_corpus(DataConfig(train_paths=[str(tmp_path / "c")], layout="file", domains=[]))


def test_a_parquet_file_without_the_text_column_names_the_file_and_its_columns(tmp_path):
    write_parquet(tmp_path / "c" / "good.parquet", {"text": ["fine"]})
    bad = write_parquet(tmp_path / "c" / "other.parquet", {"body": ["no text column"], "id": [1]})
    with pytest.raises(UserError, match=rf"^data\.text_key: {bad} has no column 'text' \(columns: \['body', 'id'\]\)"):
        resolve_corpus(DataConfig(train_paths=[str(tmp_path / "c")], layout="file", domains=[]))


def test_records_without_the_domain_field_name_data_domain_key(tmp_path):
    write_jsonl(tmp_path / "c" / "a.jsonl", [{"text": "x", "source": "web"}] * 2)
    with pytest.raises(UserError, match=r"^data\.domain_key: .* no domain field 'meta\.redpajama_set_name' "
                                        r".*--data\.domain_key="):
        resolve_corpus(DataConfig(train_paths=[str(tmp_path / "c")], layout="slimpajama"))
    fixed = DataConfig(train_paths=[str(tmp_path / "c")], layout="slimpajama", domain_key="source", domains=["web"])
    assert resolve_corpus(fixed)[0].domains == ["web"]


def test_a_folder_holding_several_splits_is_refused_naming_one(tmp_path):
    root = tmp_path / "my_dataset"
    write_parquet(root / "data" / "train-00000-of-00001.parquet", {"text": ["a"]})
    write_parquet(root / "data" / "test-00000-of-00001.parquet", {"text": ["b"]})
    with pytest.raises(DataPathError, match=r"^data\.train_paths: .* holds the splits \['test', 'train'\] .*"
                                            r"e\.g\. '.*my_dataset/data/train\*'"):
        field_shards([str(root)], "data.train_paths")
    assert len(field_shards([str(root / "data" / "train-*")], "data.train_paths")) == 1
    save_hf_dataset(tmp_path / "dd" / "train", {"text": ["x"]})
    save_hf_dataset(tmp_path / "dd" / "test", {"text": ["y"]})
    (tmp_path / "dd" / "dataset_dict.json").write_text('{"splits": ["train", "test"]}')
    with pytest.raises(DataPathError, match=r"is a saved Hugging Face DatasetDict \(splits \['test', 'train'\]\); "
                                            r"give the split to read"):
        list_shards(str(tmp_path / "dd"))
