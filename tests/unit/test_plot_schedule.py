"""``d3ray plot schedule``: which PNGs a run directory gets, from its schedule log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from d3ray.plot.schedule import plot_mixture, plot_schedule


def write_log(run_dir: Path, rows: list[dict]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "schedule_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_mixture_png_only_for_a_mixer_run(tmp_path: Path) -> None:
    import matplotlib.image

    mixed = tmp_path / "odm"
    write_log(mixed, [{"chunk_id": c, "scheduler": "odm", "fallback": False,
                       "mixture": {"RedPajamaC4": 0.5 + 0.1 * c, "RedPajamaWikipedia": 0.5 - 0.1 * c}}
                      for c in range(4)])
    made = plot_schedule(mixed)
    assert [p.name for p in made] == ["mixture.png"]
    height, width, _ = matplotlib.image.imread(made[0]).shape
    assert height > 100 and width > 100
    plain = tmp_path / "random"
    write_log(plain, [{"chunk_id": c, "scheduler": "random", "fallback": False} for c in range(4)])
    assert plot_mixture(plain, tmp_path / "none.png") is None and not (tmp_path / "none.png").exists()


def test_plot_schedule_names_a_directory_without_a_schedule_log(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no schedule_log.jsonl"):
        plot_schedule(tmp_path)
