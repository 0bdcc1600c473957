"""Reports name run directories relative to the working directory (no machine's absolute path in a
committed report), and keep paths outside it absolute."""

from __future__ import annotations

from pathlib import Path

from d3ray.run_files import display_path


def test_display_path_is_relative_inside_the_working_directory_and_absolute_outside(tmp_path, monkeypatch):
    checkout, elsewhere = tmp_path / "checkout", tmp_path / "elsewhere" / "runs"
    (checkout / "runs" / "compare").mkdir(parents=True)
    elsewhere.mkdir(parents=True)
    monkeypatch.chdir(checkout)

    assert display_path(checkout / "runs" / "compare") == "runs/compare"
    assert display_path("runs/compare/../compare") == "runs/compare"
    assert display_path(elsewhere) == elsewhere.resolve().as_posix()
    assert Path(display_path(elsewhere)).is_absolute()
