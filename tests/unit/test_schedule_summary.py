"""The run's schedule summary (d3ray/run/pretrain.py ``schedule_summary``, ``print_summary``) from a schedule log:
what decided the chunks and the predicted loss change of the chosen orders, summed over the decided chunks,
in place of the S-cost reduction that a sort makes 100% by construction (issue 47.2)."""

from __future__ import annotations

import json

import pytest

from d3ray.run.summary import print_summary, schedule_summary


def _log(tmp_path, rows):
    (tmp_path / "schedule_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def test_schedule_summary_sums_the_predicted_change_and_says_what_decided(tmp_path, capsys):
    sort = "sorted by potential, no search"
    rows = [
        {"chunk_id": 0, "fallback": False, "trainer_wait_sec": 1.0, "first_chunk": "stream_order"},
        {"chunk_id": 1, "fallback": False, "trainer_wait_sec": 0.5, "decided_by": sort, "search": False,
         "estimator": "drift(residual=none)", "predicted_loss_change_vs_stream_nats": -0.01,
         "predicted_loss_change_vs_random_nats": -0.03},
        {"chunk_id": 2, "fallback": False, "trainer_wait_sec": 0.0, "decided_by": sort, "search": False,
         "estimator": "drift(residual=none)", "predicted_loss_change_vs_stream_nats": 0.002,
         "predicted_loss_change_vs_random_nats": -0.02},
        {"chunk_id": 3, "fallback": True, "trainer_wait_sec": 0.0, "fallback_reason": "chunk 3: S cannot be searched"},
    ]
    out = schedule_summary(_log(tmp_path, rows))
    assert out["schedule/chunks"] == 4 and out["schedule/fallbacks"] == 1
    assert out["schedule/decided_by"] == f"{sort} (2 chunks)" and out["schedule/searched_chunks"] == 0
    assert out["schedule/predicted_loss_change_vs_stream_nats"] == pytest.approx(-0.008)
    assert out["schedule/predicted_loss_change_vs_random_nats"] == pytest.approx(-0.05)
    assert "schedule/cost_reduction" not in out
    print_summary({"steps": 4, **out}, {})
    printed = capsys.readouterr().out
    assert "S-cost" not in printed and sort in printed and "-0.05 nats vs the mean random order" in printed


def test_schedule_summary_of_a_scheduler_without_decisions_has_no_d3_fields(tmp_path):
    out = schedule_summary(_log(tmp_path, [{"chunk_id": 0, "fallback": False, "trainer_wait_sec": 0.2}]))
    assert out == {"schedule/chunks": 1, "schedule/fallbacks": 0, "schedule/trainer_wait_sec": 0.2}
