"""Bad evaluation input: a clear error naming file, line and field, before any model work."""

import gzip
import json

import pytest

from d3ray.eval.inputs import EvalInputError, parse_task_specs, read_choice, read_cloze, read_text_document


def write(path, lines):
    path.write_text("".join(ln + "\n" for ln in lines))
    return str(path)


def test_parse_task_specs_names_and_errors():
    tasks = parse_task_specs("cloze=data/lambada.jsonl,choice=/x/obqa.jsonl.zst,ppl=wiki.test.raw,domains=val/")
    assert [t.name for t in tasks] == ["cloze:lambada", "choice:obqa", "ppl:wiki.test", "domains:val"]
    with pytest.raises(EvalInputError, match="unknown kind 'mmlu'"):
        parse_task_specs("mmlu=x.jsonl")
    with pytest.raises(EvalInputError, match="is not KIND=FILE"):
        parse_task_specs("cloze")
    with pytest.raises(EvalInputError, match="same name"):
        parse_task_specs("cloze=a/x.jsonl,cloze=b/x.jsonl")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"context": "a", "choices": ["x", "y"], "label": 2}', "line 2: field 'label' = 2 is out of range for 2 choices"),
        ('{"context": "a", "choices": ["x", "y"], "label": -1}', "line 2: field 'label' = -1 is out of range"),
        ('{"context": "a", "choices": ["x", "y"], "label": "0"}', "line 2: field 'label' is '0', not an integer"),
        ('{"context": "a", "choices": ["x", "y"], "label": true}', "line 2: field 'label' is True, not an integer"),
        ('{"context": "a", "choices": ["x"], "label": 0}', "line 2: field 'choices' must be a list of at least 2"),
        ('{"context": "a", "choices": ["x", 3], "label": 0}', r"line 2: choices\[1\] is 3"),
        ('{"choices": ["x", "y"], "label": 0}', "line 2: missing field 'context'"),
        ("choice: x", "line 2: not a JSON line"),
    ],
)
def test_read_choice_bad_line_named(tmp_path, line, message):
    path = write(tmp_path / "mc.jsonl", ['{"context": "ok", "choices": ["x", "y"], "label": 1}', line])
    with pytest.raises(EvalInputError, match=message) as err:
        read_choice(path)
    assert str(err.value).startswith(path)


def test_read_cloze_missing_or_wrong_fields_named(tmp_path):
    path = write(tmp_path / "c.jsonl", ['{"context": "a b", "continuation": "c"}', "", '{"context": "a b"}'])
    with pytest.raises(EvalInputError, match=r"c\.jsonl line 3: missing field 'continuation'"):
        read_cloze(path)
    path = write(tmp_path / "d.jsonl", ['{"context": 5, "continuation": "c"}'])
    with pytest.raises(EvalInputError, match="line 1: field 'context' is a int, not a string"):
        read_cloze(path)
    path = write(tmp_path / "e.jsonl", ['["context", "continuation"]'])
    with pytest.raises(EvalInputError, match="line 1: a JSON list, not an object"):
        read_cloze(path)


def test_not_jsonl_files_rejected_with_the_kind(tmp_path):
    path = write(tmp_path / "lambada.txt", ["a plain text file"])
    with pytest.raises(EvalInputError, match="kind cloze wants a JSONL file"):
        read_cloze(path)
    with pytest.raises(EvalInputError, match="empty.jsonl: no examples"):
        read_cloze(write(tmp_path / "empty.jsonl", [""]))
    with pytest.raises(EvalInputError, match="no such file"):
        read_choice(str(tmp_path / "missing.jsonl"))
    (tmp_path / "bin.raw").write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(EvalInputError, match="bin.raw: not UTF-8 text at byte 0"):
        read_text_document(str(tmp_path / "bin.raw"))


def test_gzip_cloze_read_and_truncated_gzip_named(tmp_path):
    data = gzip.compress(b"".join(json.dumps({"context": f"c{i}", "continuation": "x"}).encode() + b"\n"
                                  for i in range(50)))
    (tmp_path / "ok.jsonl.gz").write_bytes(data)
    assert len(read_cloze(str(tmp_path / "ok.jsonl.gz"))) == 50
    (tmp_path / "cut.jsonl.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(EvalInputError, match="cut.jsonl.gz: truncated_gzip"):
        read_cloze(str(tmp_path / "cut.jsonl.gz"))
