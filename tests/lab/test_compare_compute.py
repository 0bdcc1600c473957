"""Compute accounting from a run directory's logs, cumulative compute per step, values at equal compute."""

from __future__ import annotations

import json

import numpy as np
import pytest

from d3ray.lab.compare.compute import (
    chunk_actor_seconds,
    compute_curve,
    eval_curve,
    run_compute,
    value_at_compute,
)


def write_run(run_dir, steps, schedule):
    run_dir.mkdir(parents=True)
    with open(run_dir / "metrics.jsonl", "w") as fh:
        for row in steps:
            fh.write(json.dumps(row) + "\n")
    with open(run_dir / "schedule_log.jsonl", "w") as fh:
        for row in schedule:
            fh.write(json.dumps(row) + "\n")


def d3_run(tmp_path):
    """4 steps in 2 chunks of 2; D3 records; evals at steps 2 and 4."""
    steps = [{"step": s, "chunk_id": (s - 1) // 2, "train/loss": 5.0, "time/step_sec": 1.0,
              "time/wait_sec": 0.5 if s == 3 else 0.0} for s in range(1, 5)]
    steps.insert(2, {"step": 2, "eval/mean_loss": 4.0})
    steps.append({"step": 4, "eval/mean_loss": 3.0})
    schedule = [{"chunk_id": c, "scheduler": "d3", "influence_sec": 2.0, "solver_sec": 0.25, "schedule_sec": 9.0,
                 "trainer_wait_sec": 0.0} for c in (0, 1)]
    write_run(tmp_path / "run", steps, schedule)
    return tmp_path / "run"


def test_run_compute_counts_trainers_times_workers_and_actor_seconds(tmp_path):
    c = run_compute(d3_run(tmp_path), num_workers=2, influence_actors=3)
    assert c.trainer_step_sec == pytest.approx(8.0) and c.trainer_wait_sec == pytest.approx(1.0)
    assert c.influence_sec == pytest.approx(12.0) and c.solver_sec == pytest.approx(0.5)
    assert c.scoring_sec == 0.0  # D3's schedule_sec is latency, its work is influence + solver
    assert c.total_sec == pytest.approx(21.5)


def test_chunk_actor_seconds_scoring_of_selectors_and_curricula():
    assert chunk_actor_seconds({"scheduler": "loss", "score_sec": 1.5})["scoring"] == 1.5
    assert chunk_actor_seconds({"scheduler": "curriculum", "schedule_sec": 2.0})["scoring"] == 2.0
    staged = {"scheduler": "loss", "order_scheduler": "curriculum", "score_sec": 1.0, "schedule_sec": 2.0}
    assert chunk_actor_seconds(staged)["scoring"] == 3.0
    assert sum(chunk_actor_seconds({"scheduler": "random"}).values()) == 0.0


def test_compute_curve_charges_chunk_work_at_its_first_step_and_equal_compute_interpolates(tmp_path):
    run = d3_run(tmp_path)
    steps, spent = compute_curve(run, num_workers=1)
    # step 1: 1 + chunk 0 (2 + .25); step 2: +1; step 3: 1 + .5 wait + chunk 1 (2.25); step 4: +1
    assert steps.tolist() == [1, 2, 3, 4]
    assert spent.tolist() == pytest.approx([3.25, 4.25, 8.0, 9.0])
    e_steps, e_vals = eval_curve(run, "eval/mean_loss")
    assert e_steps.tolist() == [2, 4] and e_vals.tolist() == [4.0, 3.0]
    # evals at compute 4.25 and 9.0: a budget of 6.625 is half-way → 3.5
    at = value_at_compute(e_steps, e_vals, steps, spent, 6.625)
    assert at.value == pytest.approx(3.5) and not at.within_budget
    assert value_at_compute(e_steps, e_vals, steps, spent, 20.0).within_budget  # cheaper than the budget: final
    assert np.isnan(value_at_compute(e_steps, e_vals, steps, spent, 1.0).value)  # before the first eval


def test_measured_scoring_log_replaces_the_latency_fields(tmp_path):
    run = tmp_path / "run"
    steps = [{"step": s, "chunk_id": (s - 1) // 2, "train/loss": 5.0, "time/step_sec": 1.0, "time/wait_sec": 0.0}
             for s in range(1, 5)]
    schedule = [{"chunk_id": c, "scheduler": "curriculum", "schedule_sec": 9.0} for c in (0, 1)]
    write_run(run, steps, schedule)
    assert run_compute(run, num_workers=1).scoring_sec == pytest.approx(18.0)  # latencies: the fallback
    (run / "scoring_log.jsonl").write_text('{"call": "losses", "sec": 0.75}\n{"call": "losses", "sec": 0.25}\n')
    assert run_compute(run, num_workers=1).scoring_sec == pytest.approx(1.0)
    _, spent = compute_curve(run, num_workers=1)
    assert spent.tolist() == pytest.approx([1.5, 2.5, 4.0, 5.0])  # 0.5 s of scoring per chunk
