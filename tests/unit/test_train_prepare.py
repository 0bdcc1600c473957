"""What a run prepares before Ray starts: a user's tokenizer path is only read, a corpus of unknown
domains stops at once, and a tokenizer is trained into the run directory only."""

import json
from pathlib import Path

import pytest

from d3ray.config import RunConfig
from d3ray.data.config import DataConfig, TokenizerConfig
from d3ray.data.sft import SftDataConfig
from d3ray.errors import UserError
from d3ray.run.prepare import prepare_data


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def sft_config(tmp_path: Path, tokenizer_path: str | None) -> RunConfig:
    rows = [{"prompt": f"{a}+{a}=", "response": str(2 * a), "task": "add"} for a in range(40)]
    records = write_jsonl(tmp_path / "sft" / "train.jsonl", rows)
    return RunConfig(output_dir=str(tmp_path / "runs"), sft=SftDataConfig(paths=[str(records)], seq_len=32),
                     data=DataConfig(tokenizer=TokenizerConfig(vocab_size=300, path=tokenizer_path)))


def test_prepare_sft_model_dir_as_tokenizer_path_is_refused_and_left_untouched(tmp_path):
    """The data-loss bug: a model directory given as data.tokenizer.path was replaced by a trained tokenizer."""
    model = tmp_path / "my-model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "gpt2"}')
    (model / "model.safetensors").write_bytes(b"weights")
    with pytest.raises(UserError, match=r"^data\.tokenizer\.path=.*my-model: a model directory without tokenizer"):
        prepare_data(sft_config(tmp_path, str(model)))
    assert sorted(p.name for p in model.iterdir()) == ["config.json", "model.safetensors"]
    assert (model / "model.safetensors").read_bytes() == b"weights"


def test_prepare_sft_without_tokenizer_path_trains_into_the_run_directory_only(tmp_path):
    cfg = sft_config(tmp_path, None)
    prepared = prepare_data(cfg)
    assert prepared.tokenizer_dir == cfg.run_dir / "tokenizer"
    record = json.loads((prepared.tokenizer_dir / "d3ray_tokenizer.json").read_text())
    assert record["texts"] == 40 and record["trained_from"]["sft.paths"] == list(cfg.sft.paths)
    assert sorted(p.name for p in (tmp_path / "sft").iterdir()) == ["train.jsonl"]


def plain_corpus(tmp_path: Path) -> Path:
    """``{"text": ...}`` JSONL in ``mydata/train/``: no meta, so the domain is the folder name, ``train``."""
    rows = [{"text": f"document {i} about plain text corpora and their words"} for i in range(50)]
    write_jsonl(tmp_path / "mydata" / "train" / "part-0.jsonl", rows)
    return tmp_path / "mydata" / "train"


def test_prepare_plain_corpus_takes_its_domain_from_its_folder(tmp_path):
    """Records of ``text`` alone, data.domains left at its default: the folder is the domain (issue 49)."""
    cfg = RunConfig(output_dir=str(tmp_path / "runs"),
                    data=DataConfig(train_paths=[str(plain_corpus(tmp_path))],
                                    tokenizer=TokenizerConfig(vocab_size=300)))
    prepared = prepare_data(cfg)
    assert (prepared.data.layout, prepared.data.domains) == ("path", ["train"])
    assert prepared.domains_line.startswith("domains: train (50 records), from the data paths' folder names")
    assert prepared.vocab_size > 257


def test_prepare_plain_corpus_of_unknown_domain_stops_before_a_tokenizer_naming_data_domains(tmp_path):
    cfg = RunConfig(output_dir=str(tmp_path / "runs"),
                    data=DataConfig(train_paths=[str(plain_corpus(tmp_path))], domains=["web"],
                                    tokenizer=TokenizerConfig(vocab_size=300)))
    with pytest.raises(UserError, match=r"^data\.domains: .* all of unknown domains \['train'\].*"
                                        r"--data\.domains='\[train\]'") as info:
        prepare_data(cfg)
    assert "\n" not in str(info.value)
    assert not (cfg.run_dir / "tokenizer").exists()


def test_prepare_plain_corpus_with_its_domain_configured_trains_and_records_the_data(tmp_path):
    corpus = plain_corpus(tmp_path)
    cfg = RunConfig(output_dir=str(tmp_path / "runs"),
                    data=DataConfig(train_paths=[str(corpus)], domains=["train"],
                                    tokenizer=TokenizerConfig(vocab_size=300)))
    prepared = prepare_data(cfg)
    trained_from = json.loads((prepared.tokenizer_dir / "d3ray_tokenizer.json").read_text())["trained_from"]
    assert trained_from["data.train_paths"] == [str(corpus)] and trained_from["data.domains"] == ["train"]
    assert prepared.vocab_size > 257  # trained on the 50 documents, not on none


def test_prepare_corpus_of_unusable_records_names_the_reason_and_the_first_line(tmp_path):
    write_jsonl(tmp_path / "mydata" / "arxiv" / "a.jsonl", [{"text": "  "}] * 5)
    cfg = RunConfig(output_dir=str(tmp_path / "runs"),
                    data=DataConfig(train_paths=[str(tmp_path / "mydata")], tokenizer=TokenizerConfig(vocab_size=300)))
    with pytest.raises(UserError, match=r"^data\.train_paths: none of the first 5 records .*empty_text.* line 1"):
        prepare_data(cfg)
    assert not (cfg.run_dir / "tokenizer").exists()


def test_prepare_corpus_without_the_text_field_names_data_text_key_the_file_and_its_keys(tmp_path):
    write_jsonl(tmp_path / "mydata" / "arxiv" / "a.jsonl", [{"body": "no text key"}] * 5)
    cfg = RunConfig(output_dir=str(tmp_path / "runs"),
                    data=DataConfig(train_paths=[str(tmp_path / "mydata")], tokenizer=TokenizerConfig(vocab_size=300)))
    with pytest.raises(UserError, match=r"^data\.text_key: none of the first 5 records .* has the field 'text' "
                                        r"\(first: mydata/arxiv/a\.jsonl line 1, .*keys: \['body'\]\); set "
                                        r"--data\.text_key=") as info:
        prepare_data(cfg)
    assert "\n" not in str(info.value) and not (cfg.run_dir / "tokenizer").exists()


def test_prepare_sft_tokenizer_path_refused_before_the_suite_is_generated(tmp_path):
    cfg = RunConfig(output_dir=str(tmp_path / "runs"), sft=SftDataConfig(),
                    data=DataConfig(tokenizer=TokenizerConfig(path=str(tmp_path / "typo"))))
    with pytest.raises(UserError, match=r"^data\.tokenizer\.path=.*typo: no such directory"):
        prepare_data(cfg)
    assert not (cfg.run_dir / "sft_data").exists()


def test_prepare_sft_bad_record_is_one_line_naming_sft_paths_and_trains_nothing(tmp_path):
    records = write_jsonl(tmp_path / "sft" / "train.jsonl", [{"prompt": "1+1=", "response": "2"}, {"prompt": "x"}])
    cfg = RunConfig(output_dir=str(tmp_path / "runs"), sft=SftDataConfig(paths=[str(records)], seq_len=32),
                    data=DataConfig(tokenizer=TokenizerConfig(vocab_size=300)))
    with pytest.raises(UserError, match=r"^sft\.paths: .*train\.jsonl.*line 2") as info:
        prepare_data(cfg)
    assert "\n" not in str(info.value) and not (cfg.run_dir / "tokenizer").exists()
