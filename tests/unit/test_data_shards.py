"""Shard listing from folders, globs and fsspec URIs (local, file://, memory://)."""

import json
import uuid

import fsspec
import pytest
import zstandard

from d3ray.data import DEFAULT_DOMAINS, iter_documents, list_shards


def record(text, domain="RedPajamaC4"):
    return json.dumps({"text": text, "meta": {"redpajama_set_name": domain}}) + "\n"


@pytest.fixture
def corpus(tmp_path):
    root = tmp_path / "corpus"
    for sub in ("train/chunk2", "train/chunk1", "validation/chunk1"):
        (root / sub).mkdir(parents=True)
    (root / "train/chunk1/b.jsonl").write_text(record("b"))
    (root / "train/chunk1/a.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(record("a").encode()))
    (root / "train/chunk2/c.jsonl.gz").write_bytes(__import__("gzip").compress(record("c").encode()))
    (root / "train/chunk1/notes.txt").write_text("not a shard")
    (root / "validation/chunk1/v.jsonl").write_text(record("v"))
    return root


def test_list_shards_folder_recursive_sorted_with_stable_names(corpus):
    shards = list_shards(str(corpus / "train"))
    assert [s.name for s in shards] == [
        "train/chunk1/a.jsonl.zst",
        "train/chunk1/b.jsonl",
        "train/chunk2/c.jsonl.gz",
    ]
    assert [s.folder for s in shards] == ["chunk1", "chunk1", "chunk2"]
    texts = [d.text for s in shards for d in iter_documents(s, "auto", DEFAULT_DOMAINS, 1 << 20)]
    assert texts == ["a", "b", "c"]


def test_list_shards_glob_file_and_several_paths_keep_path_order(corpus):
    assert [s.name for s in list_shards(str(corpus / "train" / "*" / "*.jsonl*"))] == [
        "train/chunk1/a.jsonl.zst",
        "train/chunk1/b.jsonl",
        "train/chunk2/c.jsonl.gz",
    ]
    shards = list_shards(
        [str(corpus / "validation"), str(corpus / "train/chunk1/b.jsonl"), str(corpus / "validation")]
    )
    assert [s.name for s in shards] == ["validation/chunk1/v.jsonl", "chunk1/b.jsonl"]


def test_list_shards_file_uri_reads_like_a_local_path(corpus):
    shards = list_shards(f"file://{corpus}/train")
    assert [s.name for s in shards] == [s.name for s in list_shards(str(corpus / "train"))]
    assert [d.text for d in iter_documents(shards[0], "auto", DEFAULT_DOMAINS, 1 << 20)] == ["a"]


def test_list_shards_nothing_matched_raises_naming_the_path(corpus, tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file or folder"):
        list_shards(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "x.csv").write_text("")
    with pytest.raises(FileNotFoundError, match=r"matches no shard file .* 1 other file"):
        list_shards(str(tmp_path / "empty"))
    with pytest.raises(FileNotFoundError, match="matches no shard file"):
        list_shards(str(corpus / "*.jsonl"))


def test_list_shards_same_name_from_two_roots_raises(tmp_path):
    for parent in ("p", "q"):
        (tmp_path / parent / "train").mkdir(parents=True)
        (tmp_path / parent / "train" / "x.jsonl").write_text(record("x"))
    with pytest.raises(ValueError, match="share the name 'train/x.jsonl'"):
        list_shards([str(tmp_path / "p" / "train"), str(tmp_path / "q" / "train")])


def test_list_shards_memory_filesystem_lists_and_streams():
    bucket = f"memory://d3ray-test-{uuid.uuid4().hex}"
    fs = fsspec.filesystem("memory")
    try:
        with fsspec.open(f"{bucket}/train/chunk1/s0.jsonl.zst", "wb") as fh:
            fh.write(
                zstandard.ZstdCompressor().compress(
                    (record("m0") + "{oops\n" + record("m1", "RedPajamaGithub")).encode()
                )
            )
        with fsspec.open(f"{bucket}/train/chunk1/s1.jsonl", "wb") as fh:
            fh.write(record("m2").encode())
        shards = list_shards(f"{bucket}/train")
        assert [s.name for s in shards] == ["train/chunk1/s0.jsonl.zst", "train/chunk1/s1.jsonl"]
        assert all(s.uri.startswith("memory://") for s in shards)
        docs = [d for s in shards for d in iter_documents(s, "slimpajama", DEFAULT_DOMAINS, 1 << 20)]
        assert [(d.text, d.domain, d.line, d.bad_reason) for d in docs] == [
            ("m0", "RedPajamaC4", 1, ""),
            ("", "", 2, "malformed_json"),
            ("m1", "RedPajamaGithub", 3, ""),
            ("m2", "RedPajamaC4", 1, ""),
        ]
        assert [s.name for s in list_shards(f"{bucket}/train/*/*.zst")] == ["train/chunk1/s0.jsonl.zst"]
    finally:
        fs.rm(bucket.removeprefix("memory://"), recursive=True)


def test_iter_shard_lines_resumes_at_any_line_of_any_format_reading_only_from_its_frame(tmp_path):
    from d3ray.data.shards import Shard, iter_shard_lines

    lines = [f"line {i} ".encode() + b"x" * ((i * 37) % 900) for i in range(600)]
    lines[5], lines[100] = b"", b"y" * 5000  # a blank line, an oversized one
    data = b"\n".join(lines) + b"\n"
    cuts = [0, data.index(b"\n", 20_000) + 1, data.index(b"\n", 150_000) + 1, len(data)]
    cctx = zstandard.ZstdCompressor()
    frames = [cctx.compress(data[a:b]) for a, b in zip(cuts, cuts[1:], strict=False)]
    members = [__import__("gzip").compress(data[a:b]) for a, b in zip(cuts, cuts[1:], strict=False)]
    files = {"plain.jsonl": data, "frames.jsonl.zst": b"".join(frames), "one.jsonl.zst": cctx.compress(data),
             "members.jsonl.gz": b"".join(members)}
    for name, blob in files.items():
        (tmp_path / name).write_bytes(blob)
        shard = Shard(uri=str(tmp_path / name), name=name, folder="x")
        full = list(iter_shard_lines(shard, 4000))
        assert [ln.data for ln in full] == [None if len(x) > 4000 else x for x in lines]
        for k in (1, 5, 6, 100, 101, 300, 599):
            assert list(iter_shard_lines(shard, 4000, full[k].position)) == full[k:], (name, k)
        last = full[-1].position  # in the third frame / member: decompression starts there
        expected = {"plain.jsonl": last.offset, "frames.jsonl.zst": len(frames[0]) + len(frames[1]),
                    "one.jsonl.zst": 0, "members.jsonl.gz": len(members[0]) + len(members[1])}[name]
        assert last.frame_offset == expected
        assert last.frame_start == (last.offset if name == "plain.jsonl" else 0 if name == "one.jsonl.zst"
                                    else cuts[2])
