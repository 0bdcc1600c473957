"""``d3ray census`` end to end on a real tiny run: the run's own order from checkpoint 1 reproduces the
run's checkpoint 2 (2 DeepSpeed ranks there, one rank with gradient accumulation here); the orders
differ in outcome; a census worker killed by a fault drill fails one branch, which the rerun trains (with
``--control recency``, the control's two orders as well, and nothing else); the same command again trains
nothing; ``--control planted`` (an --out of its own) trains every order on the chunk with its batch 0
shuffled; bad input stops before training with one line."""

from __future__ import annotations

import json
import shutil

import pytest

from d3ray.cli import main
from d3ray.config import RunConfig
from d3ray.config_loading import load_config
from d3ray.faults import FaultPlan, write_plan
from d3ray.run_files import read_jsonl
from tests.conftest import make_corpus

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus"), seed=3, train_docs=300, validation_docs=40, train_shards=2)


def test_census_random_run_own_order_reproduces_next_checkpoint_and_rerun_skips(ray_cluster, corpus, tmp_path, capsys):
    from d3ray.run.pretrain import run_pretrain

    data_dir, tokenizer = corpus
    cfg = load_config(RunConfig, None, [
        "--name=run", f"--output_dir={tmp_path}", f"--data.train_paths=[{data_dir / 'train'}]",
        f"--data.validation_paths=[{data_dir / 'validation'}]", f"--data.tokenizer.path={tokenizer}",
        "--data.seq_len=64", "--train.steps=8", "--train.global_batch_size=8", "--train.micro_batch_size=2",
        "--train.num_workers=2", "--train.zero_stage=0", "--train.warmup_steps=2", "--train.eval_every=0",
        "--train.keep_checkpoints=5", "--schedule.type=random", "--schedule.L=4", "--eval.max_sequences_per_domain=2",
    ])
    run_pretrain(cfg)
    run_dir, out = tmp_path / "run", tmp_path / "census"
    args = ["census", str(run_dir), "--out", str(out), "--checkpoints", "1", "--random-orders", "2", "--workers", "1"]

    # A fault drill kills the census worker as it starts the branch random_1: that branch is reported as failed,
    # and a new worker trains the others.
    write_plan(out, FaultPlan(census_exit_at_branch="random_1"))
    assert main(args) == 0
    cdir = out / "branches" / "k00001" / "c00001"
    branch_files = {p: json.loads(p.read_text()) for p in cdir.glob("*.json") if p.stem != "orders"}
    [died] = [p for p, r in branch_files.items() if "random_1" in r["names"]]
    assert branch_files[died]["status"] == "failed", branch_files[died]
    assert branch_files[died]["reason"].startswith("census worker died"), branch_files[died]
    assert all(r["status"] == "ok" for p, r in branch_files.items() if p != died)
    [row] = [line for line in (out / "results.md").read_text().splitlines() if line.startswith("| 1/1 |")]
    assert "random_1" in row.split("|")[-2]  # the failed column

    # The rerun, with the recency control added: it trains random_1 and the control's new orders; every branch
    # that finished stays as it was.
    before = {p: r for p, r in branch_files.items() if p != died}
    capsys.readouterr()
    assert main([*args, "--control", "recency"]) == 0
    new = {p.stem for p in cdir.glob("*.json")} - {p.stem for p in branch_files} - {"orders"}
    assert new <= {"recency_last", "recency_first"}  # an order trained already is only renamed
    assert f"trained {1 + len(new)} branches" in capsys.readouterr().out
    assert all(json.loads(p.read_text())["train_losses"] == b["train_losses"] for p, b in before.items())
    control = json.loads((out / "census.json").read_text())["control"]["recency"]
    [row] = control["chunks"].values()
    assert row["recency_last"]["loss"] != row["recency_first"]["loss"]
    assert "## Positive control: recency" in (out / "results.md").read_text()

    report = json.loads((out / "census.json").read_text())
    [repro] = report["reproduction"]
    assert repro["from_checkpoint"] == 1 and repro["chunk"] == 1 and repro["tensors"] > 0
    assert (run_dir / repro["against"]).is_dir() and "/" not in repro["against"]  # named inside the run, not by this box's path
    assert repro["close"], f"the run's own order drifted from the run's next checkpoint: max |Δθ| {repro['max_abs_diff']}"
    run_order = next(r["order"] for r in read_jsonl(run_dir / "schedule_log.jsonl") if r["chunk_id"] == 1)
    branches = {p.stem: json.loads(p.read_text()) for p in cdir.glob("*.json")}
    assert branches["run"]["order"] == run_order and branches[died.stem]["status"] == "ok"
    losses = {n: b["eval"]["mean_loss"] for n, b in branches.items() if n != "orders"}
    assert len(set(losses.values())) > 1, f"every order gave the same held-out loss: {losses}"
    summary = report["chunks"]["1/1"]["eval"]
    assert summary["random_n"] == 2 and summary["random_sd"] > 0 and "d3" in summary["marked"]
    assert (out / "results.md").read_text().startswith("```\nd3ray census")
    assert (out / "k00001.png").stat().st_size > 0

    # A rerun of the same command trains nothing and rewrites no branch.
    mtimes = {p: p.stat().st_mtime_ns for p in out.glob("branches/*/*/*.json")}
    assert main([*args, "--control", "recency"]) == 0
    assert "already" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in out.glob("branches/*/*/*.json")} == mtimes

    # The planted control (an --out of its own): batch 0 of the chunk shuffled, every order trains the planted chunk.
    planted_out = tmp_path / "planted"
    assert main([*args[:3], str(planted_out), *args[4:], "--no-lookahead", "--control", "planted",
                 "--planted-batch", "0"]) == 0
    capsys.readouterr()
    cdir = planted_out / "branches" / "k00001" / "c00001"
    assert json.loads((cdir / "orders.json").read_text())["planted"] == {"kind": "shuffled", "index": 0, "seed": [0, 1]}
    planted = {p.stem: json.loads(p.read_text()) for p in cdir.glob("*.json") if p.stem != "orders"}
    assert {"planted_first", "planted_last"} <= {n for b in planted.values() for n in b["names"]}
    # the stream order trains batch 0 first: its first step saw the shuffled batch, its others the same batches
    assert planted["stream"]["train_losses"][0] != branches["stream"]["train_losses"][0]
    control = json.loads((planted_out / "census.json").read_text())
    assert control["reproduction"] == []  # the run trained the unplanted chunk
    row = control["control"]["planted"]["chunks"]["1/1"]
    assert row["planted_batch"] == 0 and row["n"] == 2 and 1 <= row["d3"]["position"] <= 4
    assert row["planted_first"]["position"] == 1 and row["planted_last"]["position"] == 4
    assert "## Positive control: planted batch" in (planted_out / "results.md").read_text()

    # Bad input: one line, exit code 2, nothing trained.
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(run_dir / "config.yaml", bare / "config.yaml")
    for bad, words in ((["census", str(run_dir), "--out", str(tmp_path / "x"), "--checkpoints", "1", "--chunks", "2"],
                        "past the end of the run's stream"),
                       (["census", str(run_dir), "--out", str(tmp_path / "x"), "--eval", str(tmp_path / "none.txt")],
                        "no such file"),
                       (["census", str(bare), "--out", str(tmp_path / "x")], "no checkpoint"),
                       ([*args, "--control", "planted"], "an --out of its own")):
        assert main(bad) == 2
        err = capsys.readouterr().err
        assert words in err and err.count("\n") == 2, err  # the error line and the --debug hint
    assert not (tmp_path / "x" / "branches").exists()


@pytest.mark.parametrize("stage", [2, 3])
def test_census_of_a_zero_run_restores_its_shards_and_reproduces_its_next_checkpoint(ray_cluster, corpus, tmp_path,
                                                                                      capsys, stage):
    """A run trained by 2 ZeRO-2 / ZeRO-3 ranks (sequential order: its order of each chunk is the stream order):
    the census merges every rank's shards into its one-rank engine, and the branch in stream order reproduces the
    run's next checkpoint at float32 tolerance (weights and AdamW moments restored: without the moments the same
    branch drifts by 4e-3). A checkpoint missing a rank's optimizer shard stops the census before any training."""
    from d3ray.run.pretrain import run_pretrain

    data_dir, tokenizer = corpus
    cfg = load_config(RunConfig, None, [
        "--name=run", f"--output_dir={tmp_path}", f"--data.train_paths=[{data_dir / 'train'}]",
        f"--data.validation_paths=[{data_dir / 'validation'}]", f"--data.tokenizer.path={tokenizer}",
        "--data.seq_len=64", "--train.steps=8", "--train.global_batch_size=8", "--train.micro_batch_size=2",
        "--train.num_workers=2", f"--train.zero_stage={stage}", "--train.warmup_steps=2", "--train.eval_every=0",
        "--train.keep_checkpoints=5", "--schedule.type=sequential", "--schedule.L=4", "--eval.max_sequences_per_domain=2",
    ])
    run_pretrain(cfg)
    run_dir, out = tmp_path / "run", tmp_path / "census"
    assert main(["census", str(run_dir), "--out", str(out), "--checkpoints", "1", "--random-orders", "2",
                 "--no-lookahead", "--workers", "1"]) == 0
    [repro] = json.loads((out / "census.json").read_text())["reproduction"]
    assert repro["from_checkpoint"] == 1 and repro["chunk"] == 1 and repro["tensors"] > 0
    assert repro["close"], f"ZeRO-{stage}: the stream order drifted from the run's next checkpoint: {repro}"
    stream = json.loads((out / "branches" / "k00001" / "c00001" / "stream.json").read_text())
    assert stream["order"] == [0, 1, 2, 3] and "run" in stream["names"] and stream["status"] == "ok"

    # Bad input: rank 1's optimizer shard of checkpoint 1 lost. One line naming the checkpoint and the file.
    [ckpt] = [p.parent for p in run_dir.glob("checkpoint_*/state.json") if json.loads(p.read_text())["next_chunk"] == 1]
    (ckpt / "deepspeed" / "ds" / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    capsys.readouterr()
    assert main(["census", str(run_dir), "--out", str(tmp_path / "x"), "--checkpoints", "1"]) == 2
    err = capsys.readouterr().err
    assert f"checkpoint {ckpt} cannot be restored" in err and "zero_pp_rank_1_mp_rank_00_optim_states.pt" in err, err
    assert err.count("\n") == 2, err  # the error line and the --debug hint
    assert not (tmp_path / "x").exists()
