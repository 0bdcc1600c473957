"""``d3ray compare`` end to end on a real local Ray: a grid of tiny runs.

The first call runs a three-arm grid with a fault drill that kills one run's trainer (no retries) and an
arm whose override does not exist: both are reported as failed with their errors, the other run
completes, and the report has the expected rows. The second call (the CLI, same config) skips the
finished run (its final_metrics.json untouched) and reruns only the killed one. (Verdicts over seeds and
paired differences: test_compare_stats.py; the report's rows, verdicts and equal compute on constructed run
directories: test_compare_report.py.)
"""

from __future__ import annotations

import csv
import json

import pytest
import yaml

from d3ray.cli import main
from d3ray.config_loading import load_config
from d3ray.faults import FaultPlan, write_plan
from d3ray.lab.compare import build_plan, run_grid, write_report
from d3ray.lab.compare.grid import run_limit
from d3ray.run_files import read_jsonl
from tests.conftest import make_corpus

pytestmark = [pytest.mark.ray, pytest.mark.slow]

STEPS = 8


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus"), seed=3, train_docs=200, validation_docs=40, train_shards=1,
                       seq_len=32)


def write_compare_config(tmp_path, corpus):
    data_dir, tokenizer = corpus
    (tmp_path / "base.yaml").write_text(yaml.safe_dump({
        "data": {"train_paths": [str(data_dir / "train")], "validation_paths": [str(data_dir / "validation")],
                 "tokenizer": {"path": str(tokenizer)}, "seq_len": 32},
        "train": {"steps": STEPS, "global_batch_size": 4, "micro_batch_size": 4, "num_workers": 1,
                  "cpus_per_worker": 1, "zero_stage": 0, "warmup_steps": 2, "eval_every": 4, "log_every": 4,
                  "max_failures": 0},
        "eval": {"max_sequences_per_domain": 4},
        "schedule": {"type": "random", "L": 4},
    }))
    path = tmp_path / "compare.yaml"
    path.write_text(yaml.safe_dump({
        "name": "test", "base_config": str(tmp_path / "base.yaml"), "seeds": [0],
        "output_dir": str(tmp_path / "cmp"),
        "arms": [{"name": "random", "set": {"schedule.type": "random"}},
                 {"name": "sequential", "set": {"schedule.type": "sequential"}},
                 {"name": "bad", "set": {"schedule.nonsense": 1}}],
    }))
    return path


def test_compare_grid_reports_failures_and_rerun_skips_finished_runs(ray_cluster, corpus, tmp_path):
    from d3ray.lab.compare.config import CompareConfig

    config_file = write_compare_config(tmp_path, corpus)
    plan = build_plan(load_config(CompareConfig, config_file))
    runs = tmp_path / "cmp" / "runs"
    write_plan(runs / "sequential-s0", FaultPlan(trainer_exit_at_step=1))  # its trainer dies at its first step

    outcomes = run_grid(plan)
    status = {o.spec.name: o.status for o in outcomes}
    assert status == {"random-s0": "done", "sequential-s0": "failed", "bad-s0": "failed"}
    errors = {o.spec.name: o.error for o in outcomes}
    assert "schedule.nonsense" in errors["bad-s0"]
    assert errors["sequential-s0"] and (runs / "sequential-s0" / "compare_error.txt").is_file()
    assert json.loads((runs / "sequential-s0" / "compare_status.json").read_text())["status"] == "failed"
    report = write_report(plan, outcomes)["dir"]
    for name in ("results.md", "results.csv", "runs.csv", "loss_curves.png", "loss_vs_compute.png", "domain_ppl.png"):
        assert (report / name).is_file(), name
    rows = list(csv.DictReader(open(report / "results.csv")))
    main_rows = {r["arm"]: r for r in rows if r["metric"] == "eval/mean_loss"}
    assert set(main_rows) == {"random", "sequential", "bad"}
    assert (main_rows["random"]["n"], main_rows["sequential"]["n"], main_rows["bad"]["n"]) == ("1", "0", "0")
    assert main_rows["random"]["verdict"] == "baseline" and main_rows["random"]["best_baseline"] == "True"
    assert float(main_rows["random"]["mean"]) == pytest.approx(
        json.loads((runs / "random-s0" / "final_metrics.json").read_text())["eval/mean_loss"])
    assert {r["arm"] for r in rows if r["metric"] == "eval/mean_loss@equal_compute"} == {"random", "sequential", "bad"}
    # random's compute (one worker, no scheduler actors): its steps' and waits' seconds from its own
    # metrics.jsonl, at most the run's wall time
    steps = [r for r in read_jsonl(runs / "random-s0" / "metrics.jsonl") if "train/loss" in r]
    assert len(steps) == STEPS
    total = float(next(r for r in rows if r["metric"] == "compute/total_sec" and r["arm"] == "random")["mean"])
    assert total == pytest.approx(sum(r["time/step_sec"] + r["time/wait_sec"] for r in steps), abs=1e-5)
    wall = next(float(r["seconds"]) for r in csv.DictReader(open(report / "runs.csv"))
                if (r["arm"], r["seed"]) == ("random", "0"))
    assert 0 < total < wall
    text = (report / "results.md").read_text()
    assert "sequential-s0" in text and "schedule.nonsense" in text and "## Verdicts" in text
    finished = (runs / "random-s0" / "final_metrics.json").stat().st_mtime_ns

    # rerun through the CLI: the finished run is skipped, the killed one reruns (its drill has fired)
    assert main(["compare", "--config", str(config_file)]) == 1  # the bad arm still fails
    assert (runs / "random-s0" / "final_metrics.json").stat().st_mtime_ns == finished
    assert (runs / "sequential-s0" / "final_metrics.json").is_file()
    assert json.loads((runs / "sequential-s0" / "compare_status.json").read_text())["status"] == "done"
    assert not (runs / "sequential-s0" / "compare_error.txt").exists()
    rows = list(csv.DictReader(open(report / "runs.csv")))
    assert {(r["arm"], r["seed"], r["status"]) for r in rows} == {
        ("random", "0", "skipped"), ("sequential", "0", "done"), ("bad", "0", "failed")}
    rows = list(csv.DictReader(open(report / "results.csv")))
    assert {r["arm"]: r["n"] for r in rows if r["metric"] == "eval/mean_loss"} == {"random": "1", "sequential": "1",
                                                                                  "bad": "0"}


def test_compare_parallel_tasks_record_each_runs_error(ray_cluster, corpus, tmp_path):
    """max_concurrent_runs=2: runs are Ray tasks; an error inside one (here a missing validation path,
    found before training) fails that run with its error, the grid goes on."""
    from d3ray.lab.compare.config import CompareConfig

    config_file = write_compare_config(tmp_path, corpus)
    cfg = load_config(CompareConfig, config_file, [  # small runs: two fit the tests' 4 CPUs at once
        "--max_concurrent_runs=2", "--seeds=[0]", "--driver_cpus=0.25",
        f"--set={{data.validation_paths: [{tmp_path / 'missing'}], train.num_workers: 1, data.tokenize_cpus: 0.25}}",
        "--arms=[{name: random, set: {schedule.type: random}}, {name: sequential, set: {schedule.type: sequential}}]"])
    assert run_limit(build_plan(cfg), build_plan(cfg).runs) == 2
    outcomes = run_grid(build_plan(cfg))
    assert [o.status for o in outcomes] == ["failed", "failed"]
    assert all(o.error.startswith("DataPathError") and "missing" in o.error for o in outcomes)
    assert all((o.spec.run_dir / "compare_status.json").is_file() for o in outcomes)


def test_compare_asked_for_more_runs_at_once_than_fit_runs_what_fits_and_says_so(ray_cluster, corpus, tmp_path, capsys):
    """max_concurrent_runs=3 of runs that need 3.5 CPUs each (driver 1, trainer 1, the stream 1.5) on the tests'
    4 CPUs: one at a time, said in one line (more would wait on each other's CPUs until Ray Train's start-up
    timeout)."""
    from d3ray.lab.compare.config import CompareConfig

    cfg = load_config(CompareConfig, write_compare_config(tmp_path, corpus), [
        "--max_concurrent_runs=3", "--seeds=[0, 1]", "--arms=[{name: random, set: {}}]"])
    plan = build_plan(cfg)
    assert run_limit(plan, plan.runs) == 1
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("compare: max_concurrent_runs=3, but 1 run(s) fit this cluster at once (a run needs ")
    assert line.endswith("running 1 at a time")
    assert run_limit(plan, plan.runs, local=False) == 3  # a cluster's autoscaler may add the nodes: as asked
    cfg = load_config(CompareConfig, write_compare_config(tmp_path, corpus), ["--max_concurrent_runs=1"])
    assert run_limit(build_plan(cfg), build_plan(cfg).runs) == 1  # as asked: no cluster read, no line
    assert capsys.readouterr().out == ""


def test_compare_trunk_arms_branch_at_its_checkpoint_with_fresh_schedulers(ray_cluster, corpus, tmp_path):
    """trunk: {steps: 4}: one trunk run per seed (random order) stops at step 4 with the LR schedule of the
    full 8 steps; an arm resumes from it (LR position, data cursor) and trains steps 5..8 with its own fresh
    scheduler: the reversed arm trains chunk 1 in the reverse of random_order(seed 0, chunk 1), not in the
    trunk's own random order."""
    from d3ray.lab.compare.config import CompareConfig
    from d3ray.schedule.scheduler import random_order
    from d3ray.train.deepspeed_config import lr_factor

    config_file = write_compare_config(tmp_path, corpus)
    cfg = load_config(CompareConfig, config_file, [
        "--seeds=[0]", "--trunk={steps: 4}", "--report={metric: last_k_mean, k: 2}", "--baseline=reverse",
        "--arms=[{name: reverse, set: {schedule.type: random, schedule.order_transform: reverse}}]"])
    plan = build_plan(cfg)
    outcomes = run_grid(plan)
    assert {o.spec.name: o.status for o in outcomes} == {"reverse-s0": "done"}
    trunk = tmp_path / "cmp" / "trunks" / "trunk-s0"
    assert json.loads((trunk / "final_metrics.json").read_text())["steps"] == 4
    runs = tmp_path / "cmp" / "runs"
    train_rows = [r for r in read_jsonl(runs / "reverse-s0" / "metrics.jsonl") if "train/loss" in r]
    assert [r["step"] for r in train_rows] == [5, 6, 7, 8]
    base_train = plan.runs[0].config.train
    # train/lr of step s is the LR after s scheduler steps: the 8-step cosine at 5, not a fresh warm-up
    assert train_rows[0]["train/lr"] == pytest.approx(base_train.lr * lr_factor(5, base_train))
    arm = {r["chunk_id"]: r for r in read_jsonl(runs / "reverse-s0" / "schedule_log.jsonl")}[1]
    assert arm["order"] == list(random_order(4, 0, 1))[::-1] and arm["order_transform"] == "reverse"
    text = write_report(plan, outcomes)["dir"].joinpath("results.md").read_text()
    assert "## Shared trunk" in text and "eval/mean_loss@last2" in text
