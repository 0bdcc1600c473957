"""A rejected run removes the run folder it made, and only that: never one that existed, never one that
trained a step (d3ray.run_files.new_directories / remove_new_run_dir)."""

from __future__ import annotations

import json
from pathlib import Path

from d3ray.run_files import new_directories, remove_new_run_dir


def test_a_run_folder_made_by_the_run_goes_with_the_parents_it_made(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "exp" / "r1"
    made = new_directories(run_dir)
    assert made == [run_dir, run_dir.parent, run_dir.parent.parent]
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "config.yaml").write_text("name: r1\n")
    (run_dir / "metrics.csv").write_text("step,loss\n")  # the trainers' header: not yet a step
    assert remove_new_run_dir(made) and not (tmp_path / "runs").exists() and tmp_path.exists()


def test_a_folder_that_existed_or_a_run_that_trained_a_step_is_kept(tmp_path: Path) -> None:
    existing = tmp_path / "runs" / "mine"
    existing.mkdir(parents=True)
    (existing / "notes.txt").write_text("the user's")
    assert new_directories(existing) == [] and not remove_new_run_dir(new_directories(existing))
    assert (existing / "notes.txt").exists()
    run_dir = tmp_path / "runs" / "trained"
    made = new_directories(run_dir)
    assert made == [run_dir]  # runs/ existed: it is not the run's to remove
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 1, "train/loss": 5.0}) + "\n")
    assert not remove_new_run_dir(made) and run_dir.is_dir()
    (run_dir / "metrics.jsonl").unlink()
    (run_dir / "checkpoint_000001").mkdir()
    assert not remove_new_run_dir(made) and run_dir.is_dir()
    (run_dir / "checkpoint_000001").rmdir()
    sibling = tmp_path / "runs" / "other"
    sibling.mkdir()
    assert remove_new_run_dir(made) and not run_dir.exists() and sibling.is_dir()
