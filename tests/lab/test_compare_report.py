"""The report on constructed run directories (no training): rows, verdicts, equal compute, files.

Two arms x 3 seeds on a D3 base: random order ends at 5.0 / 5.2 / 5.4, D3 0.1 lower in every seed
(± 0.01); D3 steps cost twice as much, so at random order's compute it has done half its steps.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from d3ray.config_loading import from_dict
from d3ray.lab.compare import build_plan, run_grid, write_report
from d3ray.lab.compare.config import CompareConfig

FINAL = {"random": {0: 5.0, 1: 5.2, 2: 5.4}, "d3": {0: 4.89, 1: 5.10, 2: 5.31}}


def fake_run(run_dir, final_loss, step_sec, d3):
    """4 steps in 2 chunks, evals at steps 2 (loss + 1) and 4 (the final), a final_metrics.json."""
    run_dir.mkdir(parents=True)
    rows = []
    for step in range(1, 5):
        rows.append({"step": step, "chunk_id": (step - 1) // 2, "train/loss": 6.0 - step / 4,
                     "time/step_sec": step_sec, "time/wait_sec": 0.0})
        if step % 2 == 0:
            loss = final_loss + (1.0 if step == 2 else 0.0)
            rows.append({"step": step, "eval/mean_loss": loss, "eval/mean_loss_se": 0.02,
                         "eval/A/loss": loss, "eval/A/ppl": 2.718 ** loss, "eval/A/loss_se": 0.02})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    log = [{"chunk_id": c, "scheduler": "d3" if d3 else "random", "trainer_wait_sec": 0.0, "fallback": False,
            **({"influence_sec": 0.5, "solver_sec": 0.0} if d3 else {})} for c in (0, 1)]
    (run_dir / "schedule_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))
    final = {"steps": 4, "final_loss": 5.0, "eval/mean_loss": final_loss, "eval/mean_loss_se": 0.02,
             "eval/A/loss": final_loss, "eval/A/ppl": 2.718 ** final_loss, "eval/A/loss_se": 0.02}
    (run_dir / "final_metrics.json").write_text(json.dumps(final))


def test_report_constructed_grid_gives_rows_verdicts_and_equal_compute(tmp_path):
    cfg = from_dict(CompareConfig, {
        "base_config": "jobs/configs/tiny.yaml", "set": {"train.num_workers": 1}, "seeds": [0, 1, 2],
        "output_dir": str(tmp_path),
        "arms": [{"name": "random", "set": {"schedule.type": "random"}}, {"name": "d3", "set": {}}]})
    plan = build_plan(cfg)
    for spec in plan.runs:
        fake_run(spec.run_dir, FINAL[spec.arm][spec.seed], 1.0 if spec.arm == "d3" else 0.5, spec.arm == "d3")
    outcomes = run_grid(plan)  # everything finished: nothing runs, no Ray
    assert [o.status for o in outcomes] == ["skipped"] * 6
    report = write_report(plan, outcomes)["dir"]

    rows = {(r["metric"], r["arm"]): r for r in csv.DictReader(open(report / "results.csv"))}
    d3 = rows[("eval/mean_loss", "d3")]
    assert d3["kind"] == "method" and d3["n"] == "3" and d3["verdict"] == "better"
    assert float(d3["diff_vs_baseline"]) == pytest.approx(-0.1) and float(d3["p_value"]) == pytest.approx(0.00332, abs=1e-4)
    assert float(d3["eval_se"]) == pytest.approx(0.02)
    assert rows[("eval/mean_loss", "random")]["best_baseline"] == "True"
    # compute: random 4 x 0.5 = 2 s; d3 4 x 1 + 2 x 0.5 = 5 s (more than the budget)
    assert float(rows[("compute/total_sec", "d3")]["mean"]) == pytest.approx(5.0)
    # at 2 s D3 has done step 1 (1.5 s) and part of step 2 (2.5 s); its evals are at 2.5 s (loss + 1) and
    # 5 s (final): 2 s is before its first evaluation, so the equal-compute value is missing
    assert rows[("eval/mean_loss@equal_compute", "d3")]["n"] == "0"
    assert rows[("eval/mean_loss@equal_compute", "random")]["n"] == "3"

    text = (report / "results.md").read_text()
    assert "**d3** at equal tokens" in text and "beat random beyond seed noise" in text
    assert "| d3 | method | 3 |" in text
    runs = list(csv.DictReader(open(report / "runs.csv")))
    assert len(runs) == 6 and {r["status"] for r in runs} == {"skipped"}
    assert (report / "loss_curves.png").is_file() and (report / "domain_ppl.png").is_file()


def _grid(tmp_path, output_dir, arms, overrides=None):
    cfg = from_dict(CompareConfig, {
        "base_config": "jobs/configs/tiny.yaml", "set": {"train.num_workers": 1, **(overrides or {})},
        "seeds": [0, 1, 2], "output_dir": str(output_dir),
        "arms": [{"name": a, "set": {"schedule.type": "random"} if a != "d3" else {}} for a in arms]})
    plan = build_plan(cfg)
    for spec in plan.runs:
        if not spec.run_dir.exists():
            fake_run(spec.run_dir, FINAL[spec.arm][spec.seed], 1.0 if spec.arm == "d3" else 0.5, spec.arm == "d3")
    return plan


def test_report_rerun_with_fewer_arms_leaves_no_stale_plots(tmp_path):
    plan = _grid(tmp_path, tmp_path, ["random", "d3"])
    report = write_report(plan, run_grid(plan))["dir"]
    # what an earlier grid's report left: the schedule plots of an arm since removed, an SFT figure
    stale = [report / "d3" / "gone" / "s_heatmap.png", report / "sft_by_skill.png"]
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"png")
    mine = report / "notes.png"  # not a file the report writes: left alone
    mine.write_bytes(b"png")

    write_report(plan, run_grid(plan))

    assert not any(p.exists() for p in stale) and not (report / "d3").exists()
    assert (report / "loss_curves.png").is_file() and mine.is_file()
    assert "sft_by_skill" not in (report / "results.md").read_text()


def test_report_unigram_cache_is_recomputed_for_other_data(tmp_path):
    from d3ray.lab.compare.report import unigram_figures
    from d3ray.lab.compare.table import run_records
    from d3ray.lab.compare.unigram import figures_key, run_validation_figures
    from tests.conftest import make_corpus

    figures = []
    for seed in (0, 1):  # two corpora, one report directory
        data_dir, tokenizer = make_corpus(tmp_path / f"corpus{seed}", seed=seed, train_docs=60, validation_docs=14,
                                          train_shards=1)
        plan = _grid(tmp_path, tmp_path / "cmp", ["random"], {
            "data.train_paths": [str(data_dir / "train")], "data.validation_paths": [str(data_dir / "validation")],
            "data.tokenizer.path": str(tokenizer), "eval.max_sequences_per_domain": 2})
        plan.report_dir.mkdir(parents=True, exist_ok=True)
        records = run_records(plan, run_grid(plan))
        figures.append(unigram_figures(plan, records))
        cached = json.loads((plan.report_dir / "unigram.json").read_text())
        assert cached["key"] == figures_key(plan.runs[0].config, plan.report_dir)
        assert cached["key"]["train_paths"] == [f"../../corpus{seed}/{(data_dir / 'train').relative_to(tmp_path / f'corpus{seed}').as_posix()}"]
        assert not any(Path(p).is_absolute() for p in cached["key"]["train_paths"] + [cached["key"]["tokenizer"]])
        assert cached["figures"] == figures[-1] == run_validation_figures(plan.runs[0].config)
        assert unigram_figures(plan, records) == figures[-1]  # the same data again: read from the cache
    assert figures[0] != figures[1]
