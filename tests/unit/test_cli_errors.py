"""User errors on the command line: one or two lines on stderr naming what and where, exit status 2,
no traceback (unless --debug)."""

from __future__ import annotations

from pathlib import Path

import pytest

from d3ray.cli import main
from d3ray.errors import UserError


def _fails(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The error's two lines (the message, the --debug hint), which end stderr; no traceback anywhere."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    message, hint = err.strip().splitlines()[-2:]
    assert hint == "(add --debug for the traceback)"
    return message


def test_cli_unknown_config_key_names_the_key_and_the_known_ones(capsys, tmp_path: Path) -> None:
    err = _fails(["pretrain", f"--output_dir={tmp_path}", "--train.stepz=3"], capsys)
    assert err.startswith("d3ray pretrain: error: unknown key 'train.stepz' for TrainConfig; known keys:")
    assert "steps" in err


def test_cli_wrong_value_type_names_the_key_and_value(capsys, tmp_path: Path) -> None:
    err = _fails(["pretrain", f"--output_dir={tmp_path}", "--train.steps=abc"], capsys)
    assert "train.steps" in err and "'abc'" in err


def test_cli_missing_data_path_is_reported_before_ray_starts(capsys, tmp_path: Path) -> None:
    import ray

    ray.shutdown()  # a Ray test earlier in the session may have started one; the next one restarts it
    err = _fails(["pretrain", f"--output_dir={tmp_path}", f"--data.train_paths=[{tmp_path}/nonexistent]"], capsys)
    assert f"no such file or folder: '{tmp_path}/nonexistent'" in err
    assert not ray.is_initialized()


def test_cli_bad_matrix_file_names_the_file(capsys, tmp_path: Path) -> None:
    path = tmp_path / "bad.txt"
    path.write_text("3\n1 2 3\n4 5 6\n")
    err = _fails(["solve", str(path)], capsys)
    assert err.startswith(f"d3ray solve: error: {path}: n = 3 needs 9 numbers after it, found 6")


def test_cli_debug_shows_the_traceback(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="train.stepz"):
        main(["pretrain", f"--output_dir={tmp_path}", "--train.stepz=3", "--debug"])


def test_positional_overrides_of_a_benchmark_reach_it():
    """``d3ray bench pipeline KEY=VALUE ...``: the positional overrides apply to both runs (they were
    once replaced by the empty list of unparsed arguments, silently running the defaults)."""
    from d3ray.cli import parse_args

    args = parse_args(["bench", "pipeline", "train.zero_stage=3", "--out", "x.json",
                       "--set", "schedule.placement.type=actors"])
    assert args.overrides == ["train.zero_stage=3"]
    assert args.sets == ["schedule.placement.type=actors"]
    pretrain = parse_args(["pretrain", "--train.steps=5"])
    assert pretrain.overrides == ["--train.steps=5"]


def test_a_dotted_override_whose_value_has_a_space_is_an_override_not_the_run_dir():
    """argparse reads ``--key=value`` holding a space as a positional: ``d3ray census --config F
    "--train.betas=[0.0, 0.95]"`` once took the override for RUN_DIR and stopped with "give a RUN_DIR or
    --config FILE, one of them"."""
    from d3ray.cli import parse_args

    args = parse_args(["census", "--config", "run.yaml", "--train.betas=[0.0, 0.95]", "--out", "o"])
    assert (args.config, args.run_dir, args.out) == ("run.yaml", None, "o")
    assert args.overrides == ["--train.betas=[0.0, 0.95]"]


@pytest.mark.parametrize(("text", "expected"), [
    ("train:\n  steps: 3\n  betas: [0.9, 0.95\ndata:\n  seq_len: 64\n",
     "{file}:4:5: not valid YAML: while parsing a flow sequence expected ',' or ']', but got ':'"),
    ("- train\n- data\n", "{file}:1:1: the top level must be a mapping of sections (train:, data:, ...), got a list"),
    ("name: x\ndata: mydata/\n", "{file}:2:1: data: expected a mapping, got 'mydata/'"),
    ("train:\n  steps: ten\n", "{file}:2:3: train.steps: expected an integer, got 'ten'"),
])
def test_cli_a_config_file_that_fails_says_file_line_and_column(capsys, tmp_path: Path, text: str,
                                                                expected: str) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(text)
    err = _fails(["pretrain", "--config", str(config), f"--output_dir={tmp_path / 'runs'}"], capsys)
    assert err == "d3ray pretrain: error: " + expected.format(file=config)
    assert not (tmp_path / "runs").exists()


def test_cli_a_rejected_run_leaves_no_folder_and_keeps_a_folder_that_existed(capsys, tmp_path: Path) -> None:
    import ray

    ray.shutdown()
    missing = f"--data.train_paths=[{tmp_path}/nonexistent]"
    _fails(["pretrain", f"--output_dir={tmp_path / 'runs'}", "--name=new", missing], capsys)
    assert not (tmp_path / "runs").exists()  # neither the run folder nor the runs/ folder it made
    kept = tmp_path / "mine" / "old"
    kept.mkdir(parents=True)
    (kept / "notes.txt").write_text("the user's")
    _fails(["pretrain", f"--output_dir={tmp_path / 'mine'}", "--name=old", missing], capsys)
    assert (kept / "notes.txt").read_text() == "the user's"


def test_cli_data_inspect_of_a_plain_folder_counts_its_records_good_under_its_folder_name(capsys, tmp_path: Path):
    import json
    import re

    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "a.jsonl").write_text("".join(json.dumps({"text": f"t {i}"}) + "\n" for i in range(400)))
    (tmp_path / "train" / "readme.txt").write_text("about the corpus")
    assert main(["data", "inspect", str(tmp_path / "train")]) == 0
    out, err = capsys.readouterr()
    assert re.search(r"\ntrain/a\.jsonl +400 +0 ", out) and "bad records: none" in out
    assert "domains: train (64 records sampled), from the data paths' folder names" in err
    assert "data inspect: 1 file(s) not read, not of a kind d3ray reads" in err and "train/readme.txt" in err
