"""``d3ray eval --tasks NAME [--include-path DIR]`` (d3ray/eval/named.py): a user's own lm-eval task YAML over a
local JSONL is evaluated by name, with the answer known from the model's logits; a task whose data is not
local (a Hugging Face dataset outside the cache, a missing data file) is refused in one line first."""

from __future__ import annotations

import json

import pytest

from d3ray.cli import main
from d3ray.eval.inputs import EvalInputError
from d3ray.eval.named import data_problem, prepare_named_tasks
from tests.unit.test_eval_harness import certain_model, single_token, tokenizer  # noqa: F401 (fixture)

TASK_YAML = """\
task: my_words
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: loglikelihood
doc_to_text: context
doc_to_target: continuation
target_delimiter: ""
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1
"""


def test_eval_include_path_user_task_by_name_scores_known_answers(tokenizer, tmp_path, monkeypatch, capsys):  # noqa: F811
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))
    pens = single_token(tokenizer, " pens")
    single_token(tokenizer, " apples")
    model_dir = tmp_path / "model"
    certain_model(tokenizer, pens).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    rows = [{"context": "Ann has", "continuation": " pens"}, {"context": "Ann has", "continuation": " apples"},
            {"context": "How many", "continuation": " pens"}, {"context": "the a", "continuation": " apples"}]
    data = tmp_path / "words.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tasks = tmp_path / "my_tasks"
    tasks.mkdir()
    (tasks / "my_words.yaml").write_text(TASK_YAML.format(data=data))
    out = tmp_path / "results.json"
    assert main(["eval", str(model_dir), "--tasks", "my_words", "--include-path", str(tasks),
                 "--out", str(out), "--batch-size", "4"]) == 0
    result = json.loads(out.read_text())
    assert result["metrics"]["eval/my_words/acc"] == 0.5  # the model is certain of " pens": 2 of 4
    assert result["examples"]["my_words"] == 4
    assert "my_words" in capsys.readouterr().out


def test_eval_named_task_missing_folder_or_data_file_refused_in_one_line(tmp_path):
    with pytest.raises(EvalInputError, match=r"^--include-path .*nope: no such folder"):
        prepare_named_tasks(["my_words"], str(tmp_path / "nope"))
    config = {"dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(tmp_path / "gone.jsonl")}}}
    problem = data_problem("my_words", config, cached=lambda path, subset: True)
    assert problem.startswith(f"--tasks my_words: data file {tmp_path / 'gone.jsonl'} is not a local file")


def test_eval_named_task_hub_dataset_outside_cache_says_not_local():
    config = {"dataset_path": "Rowan/hellaswag", "dataset_name": None}
    problem = data_problem("hellaswag", config, cached=lambda path, subset: False)
    assert problem.startswith("--tasks hellaswag: its data, the Hugging Face dataset Rowan/hellaswag, is not local")
    assert "\n" not in problem
    assert data_problem("hellaswag", config, cached=lambda path, subset: path == "Rowan/hellaswag") is None
