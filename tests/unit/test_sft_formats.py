"""SFT records in the Alpaca and ShareGPT layouts (LLaMA-Factory's names), with a column mapping, from
JSONL or parquet: the same conversations as d3ray's own records, bad ones counted, a layout the files
do not have stopped in one line naming sft.format / sft.columns."""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from d3ray.data import BadRecordLedger, SftDataConfig, iter_sft_sequences, list_shards
from d3ray.data.config import TokenizerConfig
from d3ray.data.sft import iter_sft_records
from d3ray.data.sft_formats import SftColumns, SftTags
from d3ray.data.sft_sequences import check_sft_sample, sft_task_counts
from d3ray.data.tokenizer import train_tokenizer_from_texts
from d3ray.errors import UserError


def write_jsonl(path: Path, rows: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def conversations(path: Path, cfg: SftDataConfig) -> list[tuple]:
    return [(r.line, r.task, r.messages, r.bad_reason) for s in list_shards(str(path))
            for r in iter_sft_records(s, cfg.default_task, cfg.max_record_bytes, cfg.fields())]


def test_alpaca_records_become_conversations_with_input_system_and_history(tmp_path):
    path = write_jsonl(tmp_path / "alpaca.jsonl", [
        {"instruction": "Add the numbers.", "input": "2 and 3", "output": "5"},
        {"instruction": "Say hi.", "output": "hi", "system": "Be brief.", "history": [["a?", "b."]], "task": "chat"},
        {"instruction": "No answer."},  # missing_response
        {"instruction": "", "input": "", "output": "x"},  # empty_prompt
        {"instruction": "q", "output": "a", "history": [["only one"]]},  # bad_messages
    ])
    cfg = SftDataConfig(paths=[str(path)], format="alpaca")
    assert conversations(path, cfg) == [
        (1, "sft", (("user", "Add the numbers.\n2 and 3"), ("assistant", "5")), ""),
        (2, "chat", (("system", "Be brief."), ("user", "a?"), ("assistant", "b."), ("user", "Say hi."),
                     ("assistant", "hi")), ""),
        (3, "sft", (), "missing_response"), (4, "sft", (), "empty_prompt"), (5, "sft", (), "bad_messages")]


def test_sharegpt_records_map_roles_and_refuse_tool_turns(tmp_path):
    path = write_jsonl(tmp_path / "sharegpt.jsonl", [
        {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}], "system": "S"},
        {"conversations": [{"from": "system", "value": "S2"}, {"from": "human", "value": "q"},
                           {"from": "gpt", "value": "a"}]},
        {"conversations": [{"from": "human", "value": "q"}, {"from": "function_call", "value": "{}"}]},
        {"conversations": [{"from": "human", "value": "q"}]},
    ])
    cfg = SftDataConfig(paths=[str(path)], format="sharegpt")
    got = conversations(path, cfg)
    assert got[:2] == [(1, "sft", (("system", "S"), ("user", "hi"), ("assistant", "hello")), ""),
                       (2, "sft", (("system", "S2"), ("user", "q"), ("assistant", "a")), "")]
    assert [r[3] for r in got[2:]] == ["bad_messages", "bad_messages"]
    record = list(iter_sft_records(list_shards(str(path))[0], fields=cfg.fields()))[2]
    assert "from 'function_call'" in record.detail and "tool turns are not supported" in record.detail


def test_column_mapping_and_openai_tags_read_other_names(tmp_path):
    qa = write_jsonl(tmp_path / "qa.jsonl", [{"question": "2+2=", "answer": "4", "skill": "add"}])
    cfg = SftDataConfig(paths=[str(qa)], columns=SftColumns(prompt="question", response="answer", task="skill"))
    assert conversations(qa, cfg) == [(1, "add", (("user", "2+2="), ("assistant", "4")), "")]
    chat = write_jsonl(tmp_path / "chat.jsonl", [
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}])
    openai = SftDataConfig(paths=[str(chat)], format="sharegpt", columns=SftColumns(messages="messages"),
                           tags=SftTags(role_tag="role", content_tag="content", user_tag="user",
                                        assistant_tag="assistant"))
    assert conversations(chat, openai) == [(1, "sft", (("user", "q"), ("assistant", "a")), "")]


def test_a_column_the_format_does_not_have_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"sft\.columns\.prompt does not apply to sft\.format=sharegpt"):
        SftDataConfig(format="sharegpt", columns=SftColumns(prompt="q"))
    with pytest.raises(ValueError, match=r"sft\.tags\.role_tag applies to message lists"):
        SftDataConfig(format="alpaca", tags=SftTags(role_tag="role"))
    with pytest.raises(ValueError, match=r"sft\.format must be one of"):
        SftDataConfig(format="openai")


def test_alpaca_parquet_trains_the_same_sequences_as_alpaca_jsonl_and_counts_bad_rows(tmp_path):
    rows = [{"instruction": f"double {i}", "input": None if i % 2 else "please", "output": str(2 * i),
             "task": "double" if i % 3 else "other"} for i in range(12)]
    rows[5]["output"] = None  # missing_response: a parquet null is an absent field
    write_jsonl(tmp_path / "j" / "data.jsonl", [{k: v for k, v in r.items() if v is not None} for r in rows])
    (tmp_path / "p").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "p" / "data.parquet", row_group_size=5)
    tok = train_tokenizer_from_texts([f"double {i} please {2 * i}" for i in range(12)],
                                     TokenizerConfig(vocab_size=300), tmp_path / "tok")
    out = {}
    for name in ("j", "p"):
        cfg = SftDataConfig(paths=[str(tmp_path / name)], format="alpaca", seq_len=32, max_bad_fraction=0.2)
        ledger = BadRecordLedger()
        seqs = list(iter_sft_sequences(cfg, str(tok), ledger))
        out[name] = [(s.domain, s.sample_id.split("/", 1)[1], s.tokens.tolist(), s.loss_mask.tolist()) for s in seqs]
        assert ledger.total_good == 11 and ledger.bad_by_reason() == {"missing_response": 1}
        assert sft_task_counts(cfg) == {"double": 7, "other": 4}
    assert out["j"] and [(d, i.replace(".jsonl", ""), t, m) for d, i, t, m in out["j"]] == \
        [(d, i.replace(".parquet", ""), t, m) for d, i, t, m in out["p"]]


def test_sft_sample_of_another_layout_stops_naming_sft_format(tmp_path):
    path = write_jsonl(tmp_path / "alpaca.jsonl", [{"instruction": "q", "input": "", "output": "a"}] * 3)
    with pytest.raises(UserError, match=r"^sft\.format: none of the first 3 records .* sft\.format=d3ray .*"
                                        r"alpaca\.jsonl line 1.*an alpaca record\? --sft\.format=alpaca"):
        check_sft_sample(SftDataConfig(paths=[str(path)]))
    check_sft_sample(SftDataConfig(paths=[str(path)], format="alpaca"))  # passes
    with pytest.raises(UserError, match=rf"^sft\.paths: no such file or folder: '{tmp_path}/nope'"):
        check_sft_sample(SftDataConfig(paths=[str(tmp_path / "nope")]))
