"""A run directory that already holds a run (d3ray/run/rerun.py): exact small cases on written directories.
The real run, refused and returned again: tests/integration/test_d3_default_order.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from d3ray.config import RunConfig
from d3ray.config_loading import load_config, to_dict
from d3ray.errors import UserError
from d3ray.run.rerun import RESUMABLE_KEYS, check_rerun, flat, stored_config_changes


def planned(*overrides: str) -> RunConfig:
    return load_config(RunConfig, None, list(overrides))


def config(*overrides: str) -> dict:
    return to_dict(planned(*overrides))


def written_run(run_dir: Path, cfg: dict, *, checkpoint: bool = True, final_steps: int | None = None) -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    if checkpoint:
        (run_dir / "checkpoint_2026-12-06_00-00-00.000000").mkdir()
    if final_steps is not None:
        (run_dir / "final_metrics.json").write_text(json.dumps({"steps": final_steps, "final_loss": 3.5}))
    return run_dir


def test_flat_names_every_leaf_by_its_dotted_path_and_reads_tuples_as_lists():
    assert flat({"a": 1, "b": {"c": (1, 2), "d": {"e": None}}, "f": {}}) == {
        "a": 1, "b.c": [1, 2], "b.d.e": None, "f": {}}


def test_stored_config_changes_puts_the_outermost_type_first_and_skips_the_ignored_keys():
    saved = config("--train.max_failures=3", "--train.stop_at_step=4", "--ray.num_cpus=2")
    changes, _ = stored_config_changes(
        saved, planned("--schedule.type=odm", "--schedule.L=3", "--train.max_failures=0"), RESUMABLE_KEYS)
    assert changes[0] == ("schedule.type", "d3", "odm") and ("schedule.L", 8, 3) in changes
    assert not [key for key, _, _ in changes if key.startswith(("train.", "ray."))]
    assert stored_config_changes(saved, planned(), RESUMABLE_KEYS) == ([], [])
    assert [key for key, _, _ in stored_config_changes(saved, planned())[0]] == [
        "ray.num_cpus", "train.max_failures", "train.stop_at_step"]


def test_a_key_the_stored_config_predates_reads_as_its_default_and_a_removed_key_is_a_change():
    saved = config()
    del saved["train"]["max_failures"]
    assert stored_config_changes(saved, planned()) == ([], ["train.max_failures"])
    saved["train"]["retired_key"] = 1  # not a key of today's TrainConfig: the raw file is compared
    assert stored_config_changes(saved, planned())[0] == [("train.max_failures", None, planned().train.max_failures),
                                                          ("train.retired_key", 1, None)]


def test_a_directory_without_a_trained_run_starts_it(tmp_path):
    assert check_rerun(tmp_path / "absent", planned(), 120) is None
    untrained = written_run(tmp_path / "untrained", config("--schedule.type=odm"), checkpoint=False)
    assert check_rerun(untrained, planned(), 120) is None  # config.yaml of a run stopped before its first step


def test_a_run_trained_with_another_config_is_refused_naming_the_keys(tmp_path):
    run_dir = written_run(tmp_path / "runs" / "d3ray-tiny", config())
    with pytest.raises(UserError) as err:
        check_rerun(run_dir, planned("--schedule.type=odm", "--schedule.L=3"), 120)
    message = str(err.value)
    assert "holds a run trained with another config (schedule.type: 'd3' → 'odm', schedule.L: 8 → 3" in message
    assert "--name=NEW" in message and "config.yaml" in message and "\n" not in message


def test_a_run_whose_steps_were_logged_counts_as_trained_without_a_local_checkpoint(tmp_path):
    run_dir = written_run(tmp_path / "cloud", config(), checkpoint=False)  # checkpoints in storage_path
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 1, "train/loss": 5.0}) + "\n")
    with pytest.raises(UserError, match=r"train.steps: 120 → 60"):
        check_rerun(run_dir, planned("--train.steps=60"), 60)


def test_the_same_config_resumes_a_stopped_run_and_returns_a_finished_one(tmp_path):
    stopped = written_run(tmp_path / "stopped", config())
    moved = planned("--train.max_failures=0", "--ray.num_cpus=8", f"--output_dir={tmp_path / 'moved'}")
    assert check_rerun(stopped, moved, 120) is None
    finished = written_run(tmp_path / "finished", config(), final_steps=120)
    assert check_rerun(finished, planned(), 120) == {"steps": 120, "final_loss": 3.5}
    trunk = written_run(tmp_path / "trunk", config("--train.stop_at_step=40"), final_steps=40)
    assert check_rerun(trunk, planned(), 120) is None  # the trunk stopped at 40 goes on to its end
    assert check_rerun(trunk, planned("--train.stop_at_step=40"), 40) == {"steps": 40, "final_loss": 3.5}
