"""The sweep's results table and best config: ranking (finished trials first, non-finite never
ranks), the CSV, the γ note, and a best config that loads back as a fresh RunConfig."""

from __future__ import annotations

import csv
import io
import math

import pytest

from d3ray.config import RunConfig
from d3ray.config_loading import load_config
from d3ray.tune.results import (
    best_config_yaml,
    best_row,
    format_table,
    gamma_changes_order,
    rank_rows,
    results_csv,
    trial_row,
)

METRIC = "eval/mean_loss"


def cfg(*overrides: str) -> RunConfig:
    return load_config(RunConfig, None, ["--train.steps=8", "--output_dir=/tmp/sweep/runs", *overrides])


def rows():
    return [
        trial_row(
            "t0",
            {"schedule.L": 4},
            cfg("--name=s-t0"),
            {"step": 8, METRIC: 6.9, "final_loss": 7.0},
            None,
            METRIC,
        ),
        trial_row(
            "t1", {"schedule.L": 8}, cfg("--name=s-t1"), {"step": 4, METRIC: 6.5}, None, METRIC
        ),  # ASHA stop
        trial_row("t2", {"schedule.L": 2}, cfg("--name=s-t2"), {"step": 8, METRIC: 6.7}, None, METRIC),
        trial_row("t3", {"schedule.L": 1}, cfg("--name=s-t3"), {"step": 8, METRIC: math.nan}, None, METRIC),
        trial_row("t4", {"schedule.L": 3}, cfg("--name=s-t4"), None, RuntimeError("boom\ndiverged"), METRIC),
        trial_row(
            "t5", {"schedule.L": 5}, cfg("--name=s-t5"), {"step": 4, METRIC: 6.6}, None, METRIC, "RUNNING"
        ),
    ]


def test_rank_rows_finished_by_metric_then_stopped_early_then_no_metric():
    ranked = rank_rows(rows(), "min")
    assert [r.trial_id for r in ranked] == ["t2", "t0", "t1", "t5", "t3", "t4"]
    statuses = ["completed", "completed", "stopped early", "unfinished", "completed", "error"]
    assert [r.status for r in ranked] == statuses
    assert ranked[4].metric is None and ranked[5].error == "diverged"
    assert best_row(ranked, "min").trial_id == "t2" and best_row(ranked, "max").trial_id == "t0"


def test_results_csv_one_row_per_trial_with_params_and_metric():
    table = list(csv.DictReader(io.StringIO(results_csv(rank_rows(rows(), "min"), ["schedule.L"], METRIC))))
    assert [r["trial_id"] for r in table] == ["t2", "t0", "t1", "t5", "t3", "t4"]
    assert (
        table[1]["schedule.L"] == "4"
        and float(table[1][METRIC]) == 6.9
        and float(table[1]["final_loss"]) == 7.0
    )
    assert table[4][METRIC] == "" and table[5]["status"] == "error"
    assert table[0]["run_dir"] == "/tmp/sweep/runs/s-t2"
    assert "gamma_changes_order" not in table[0], "no γ column when γ does not vary"


def test_format_table_gamma_column_and_note_when_gamma_varies():
    d3 = ["--schedule.type=d3", "--schedule.placement.type=actors"]  # the look-ahead runs on influence actors
    gamma_rows = [
        trial_row(
            "a", {"schedule.influence.gamma": 0.01}, cfg(*d3, "--schedule.influence.gamma=0.01"),
            {"step": 8, METRIC: 6.0}, None, METRIC
        ),
        trial_row(
            "b",
            {"schedule.influence.gamma": 0.1},
            cfg(*d3, "--schedule.influence.gamma=0.1", "--schedule.influence.estimator=lookahead",
                "--schedule.influence.preconditioner=none"),
            {"step": 8, METRIC: 6.1},
            None,
            METRIC,
        ),
        trial_row(  # the AdamW step does not use γ, even for the exact look-ahead
            "c", {"schedule.influence.gamma": 0.2}, cfg(*d3, "--schedule.influence.gamma=0.2", "--schedule.influence.estimator=lookahead"),
            {"step": 8, METRIC: 6.2}, None, METRIC,
        ),
    ]
    text = format_table(gamma_rows, ["schedule.influence.gamma"], METRIC)
    header, first, second, third = text.splitlines()[:4]
    assert "gamma_changes_order" in header and first.split()[-1] == "no" and second.split()[-1] == "yes"
    assert third.split()[-1] == "no"
    assert "only scales S" in text.splitlines()[-1]


@pytest.mark.parametrize(("overrides", "answer"), [
    (["--schedule.type=d3"], "no"),  # the drift estimator with the AdamW step: γ unused
    (["--schedule.type=d3", "--schedule.placement.type=actors", "--schedule.influence.estimator.type=lookahead",
      "--schedule.influence.preconditioner=none"], "yes"),
    (["--schedule.type=loss", "--schedule.order.type=d3", "--schedule.order.influence.estimator.type=lookahead",
      "--schedule.order.influence.preconditioner=none"], "yes"),  # a selector's D3 order stage answers
    (["--schedule.type=odm", "--schedule.order.type=d3"], "no"),
    (["--schedule.type=loss"], "n/a"),  # its order stage (random) has no γ
    (["--schedule.type=random"], "n/a"),
])
def test_gamma_changes_order_is_read_from_the_influence_the_schedule_declares(overrides, answer):
    assert gamma_changes_order(cfg(*overrides)) == answer


def test_best_config_yaml_loads_as_fresh_run(tmp_path):
    best = best_row(rows(), "min")
    path = tmp_path / "best_config.yaml"
    path.write_text(best_config_yaml(best, "s", METRIC))
    loaded = load_config(RunConfig, path)
    assert loaded.name == "s-best" and loaded.output_dir == "runs"
    assert loaded.train == best.cfg.train and loaded.schedule == best.cfg.schedule
    assert "t2" in path.read_text().splitlines()[0]
