"""The pipeline benchmark's per-position step profile (pure function over metrics rows)."""

import pytest

from d3ray.bench.pipeline import step_seconds_by_position


def test_step_seconds_by_position_averages_each_position_of_the_chunk():
    rows = [{"step": s, "time/step_sec": t} for s, t in enumerate([0.3, 0.1, 0.2, 0.5, 0.1, 0.4], start=1)]
    rows.append({"step": 7})  # a row without a step time (e.g. an eval row) is ignored
    assert step_seconds_by_position(rows, L=3) == pytest.approx([0.4, 0.1, 0.3])


def test_step_seconds_by_position_marks_positions_never_reached():
    rows = [{"step": 1, "time/step_sec": 0.2}]
    assert step_seconds_by_position(rows, L=2) == [0.2, None]


def test_snapshot_summary_averages_the_logged_snapshot_bytes_and_names_the_dtype():
    from d3ray.bench.pipeline import snapshot_summary

    rows = [{"chunk_id": 0, "snapshot_bytes": 100, "snapshot_dtype": "bfloat16"},
            {"chunk_id": 1, "snapshot_bytes": 300, "snapshot_dtype": "bfloat16"},
            {"chunk_id": 2, "reused_from_checkpoint": True}]  # a restored decision: size unknown, not averaged
    assert snapshot_summary(rows) == {"snapshot_bytes_per_chunk": 200.0, "snapshot_dtype": "bfloat16"}
    assert snapshot_summary([{"chunk_id": 0, "order": [0]}]) == {}  # a scheduler that reads no weights
