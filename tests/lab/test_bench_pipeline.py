"""The pipeline benchmark's pure parts: the per-position step profile, the pairs' ratio interval, the configs."""

import math

import pytest

from d3ray.lab.bench.pipeline import ratio_interval, step_seconds_by_position


def test_ratio_interval_is_a_t_interval_on_the_logarithms_of_the_pairs():
    # logs +0.1 and -0.1: mean 0, sd 0.1414, standard error 0.1, t(0.975, 1 df) = 12.7062
    mean, low, high = ratio_interval([math.exp(0.1), math.exp(-0.1)])
    assert mean == pytest.approx(1.0)
    assert low == pytest.approx(math.exp(-1.27062), rel=1e-4) and high == pytest.approx(math.exp(1.27062), rel=1e-4)
    assert ratio_interval([0.93, 0.93, 0.93, 0.93]) == pytest.approx((0.93, 0.93, 0.93))
    # four pairs spread like the 2-core box's: the interval holds the geometric mean and is narrower at 90%
    pairs = [0.833, 1.000, 1.033, 0.915]
    mean, low, high = ratio_interval(pairs)
    assert low < mean < high and mean == pytest.approx(math.prod(pairs) ** 0.25)
    _, low90, high90 = ratio_interval(pairs, level=0.90)
    assert low < low90 and high90 < high


def test_ratio_interval_needs_two_pairs_and_positive_ratios():
    assert ratio_interval([0.95]) is None
    with pytest.raises(ValueError, match="finite and > 0"):
        ratio_interval([0.9, 0.0])


def test_step_seconds_by_position_averages_each_position_of_the_chunk():
    rows = [{"step": s, "time/step_sec": t} for s, t in enumerate([0.3, 0.1, 0.2, 0.5, 0.1, 0.4], start=1)]
    rows.append({"step": 7})  # a row without a step time (e.g. an eval row) is ignored
    assert step_seconds_by_position(rows, L=3) == pytest.approx([0.4, 0.1, 0.3])


def test_step_seconds_by_position_marks_positions_never_reached():
    rows = [{"step": 1, "time/step_sec": 0.2}]
    assert step_seconds_by_position(rows, L=2) == [0.2, None]


def test_bench_configs_start_both_runs_from_the_shipped_real_data_config(tmp_path):
    """``--config jobs/configs/redpajama_sample.yaml``: both runs read the real sample with the config's
    model, trainers and steps; the random run keeps random order, the scheduler run gets D3 with its
    own defaults (the config's schedule is random order), and ``--set`` reaches only that run."""
    import argparse
    from pathlib import Path

    from d3ray.lab.bench.pipeline import add_arguments, bench_configs

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    config = Path(__file__).resolve().parents[2] / "jobs" / "configs" / "redpajama_sample.yaml"
    args = parser.parse_args(["--out", "x.json", "--config", str(config), "--work-dir", str(tmp_path),
                              "--set", "schedule.influence.sketch.k=256", "train.num_workers=1"])
    random_cfg, d3_cfg = bench_configs(args)
    assert random_cfg.schedule.type_name == "random" and d3_cfg.schedule.type_name == "d3"
    assert random_cfg.data == d3_cfg.data and "slimpajama_format" in d3_cfg.data.train_paths[0]
    assert random_cfg.train.steps == d3_cfg.train.steps == 200 and d3_cfg.schedule.L == 8
    assert random_cfg.train.num_workers == d3_cfg.train.num_workers == 1  # a positional override: both runs
    assert d3_cfg.schedule.influence.sketch.k == 256 and random_cfg.run_dir != d3_cfg.run_dir
    assert d3_cfg.train.eval_every == 0 and d3_cfg.eval.max_sequences_per_domain == 16  # the config's eval set


def test_snapshot_summary_averages_the_logged_snapshot_bytes_and_names_the_dtype():
    from d3ray.lab.bench.pipeline import snapshot_summary

    rows = [{"chunk_id": 0, "snapshot_bytes": 100, "snapshot_dtype": "bfloat16"},
            {"chunk_id": 1, "snapshot_bytes": 300, "snapshot_dtype": "bfloat16"},
            {"chunk_id": 2, "reused_from_checkpoint": True}]  # a restored decision: size unknown, not averaged
    assert snapshot_summary(rows) == {"snapshot_bytes_per_chunk": 200.0, "snapshot_dtype": "bfloat16"}
    assert snapshot_summary([{"chunk_id": 0, "order": [0]}]) == {}  # a scheduler that reads no weights


def _run(step_secs, tokens=100, train_seconds=10.0, waits=(1.0, 0.5), fallbacks=0):
    return {"tokens": tokens, "tokens_per_sec": tokens / train_seconds, "train_seconds": train_seconds,
            "chunks": len(waits), "trainer_wait_sec": sum(waits), "first_chunk_wait_sec": waits[0],
            "trainer_wait_fraction": sum(waits) / train_seconds, "final_loss": 4.0, "eval_mean_loss": None,
            "step_sec_by_chunk_position": [step_secs[0], None], "step_secs": step_secs,
            "mean_step_sec": sum(step_secs) / len(step_secs), "fallbacks": fallbacks, "snapshot_dtype": "bfloat16"}


def test_pool_summaries_sums_tokens_seconds_and_waits_and_pools_every_step():
    from d3ray.lab.bench.pipeline import pool_summaries

    pooled = pool_summaries([_run([0.1, 0.3], tokens=100, train_seconds=10.0, waits=(1.0, 0.5)),
                             _run([0.2, 0.2, 0.6], tokens=300, train_seconds=30.0, waits=(2.0, 0.5), fallbacks=1)])
    assert pooled["tokens_per_sec"] == pytest.approx(400 / 40)  # not the mean of the two rates
    assert pooled["steady_tokens_per_sec"] == pytest.approx(400 / (40 - 3.0))
    assert pooled["trainer_wait_fraction"] == pytest.approx(4.0 / 40)
    assert pooled["trainer_wait_fraction_after_first_chunk"] == pytest.approx(1.0 / 40)
    assert pooled["mean_step_sec"] == pytest.approx(1.4 / 5) and pooled["median_step_sec"] == pytest.approx(0.2)
    assert pooled["step_sec_by_chunk_position"] == [pytest.approx(0.15), None]
    assert pooled["fallbacks"] == 1 and pooled["chunks"] == 4 and pooled["snapshot_dtype"] == "bfloat16"
    assert len(pooled["runs"]) == 2


def test_pool_summaries_sums_the_checkpoint_parts_of_every_run():
    from d3ray.lab.bench.pipeline import pool_summaries

    runs = [_run([0.1], tokens=10, train_seconds=1.0, waits=(0.0,)), _run([0.1], tokens=10, train_seconds=1.0, waits=(0.0,))]
    runs[0]["checkpoint_parts_sec"] = {"state": 0.01, "save": 0.5, "report": 0.25}
    runs[1]["checkpoint_parts_sec"] = {"state": 0.03, "save": 0.5, "report": 0.75}
    assert pool_summaries(runs)["checkpoint_parts_sec"] == pytest.approx({"state": 0.04, "save": 1.0, "report": 1.0})


def test_repeats_alternate_which_run_goes_first_and_random_is_its_own_a_a_check():
    from d3ray.lab.bench.pipeline import repeat_order, run_labels

    assert repeat_order(4) == [(0, False), (1, True), (2, False), (3, True)]
    assert run_labels("loss_reweight") == ("random", "loss_reweight")
    assert run_labels("random") == ("random", "random_b")  # two run directories, not one resumed twice


def test_bench_step_times_both_paths_of_the_loop_step_and_writes_the_ratio(tmp_path):
    """``d3ray bench step`` on a minimal step: both kinds measured, and the weighted kind really weights."""
    import argparse
    import json

    from d3ray.lab.bench.step import PHASES, add_arguments, run

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    out = tmp_path / "step.json"
    assert run(parser.parse_args(["--out", str(out), "--steps", "2", "--seq-len", "16", "--vocab", "64"])) == 0
    report = json.loads(out.read_text())
    assert all(report[kind][f"{phase}_ms"] > 0 for kind in ("unweighted", "weighted") for phase in PHASES)
    # what was timed: the plain step's weights are all 1 (None); linupper on random-token losses spreads
    # them (a bench that timed the unweighted path twice would report 1 for both)
    assert report["unweighted"]["weight_spread"] == 1.0 and report["weighted"]["weight_spread"] > 1.05
    assert report["weighted_step_ratio"] == pytest.approx(
        report["weighted"]["mean_step_ms"] / report["unweighted"]["mean_step_ms"])
