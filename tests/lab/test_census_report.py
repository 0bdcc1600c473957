"""The census report from branch files written by hand: z, rank, the objective's correlation, the summary."""

from __future__ import annotations

import json
import math

import pytest

from d3ray.lab.census.analysis import across_chunks, chunk_summary, collect
from d3ray.lab.census.report import write_report


def write_branch(cdir, names, order, loss):
    cdir.mkdir(parents=True, exist_ok=True)
    result = {"names": names, "order": order, "status": "ok", "eval": {"mean_loss": loss}, "train_losses": [loss]}
    (cdir / f"{names[0]}.json").write_text(json.dumps(result))


@pytest.fixture
def census_dir(tmp_path):
    cdir = tmp_path / "branches" / "k00002" / "c00002"
    # S[0, 1] = 1: batch 0 before batch 1; an order costs 1 when it puts 1 before 0
    S = [[0.0, 1.0, 0.0], [-1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    cdir.mkdir(parents=True)
    (cdir / "orders.json").write_text(json.dumps({"S": S, "d3": [0, 2, 1]}))
    write_branch(cdir, ["stream", "random_0"], [0, 1, 2], 1.0)  # cost 0
    write_branch(cdir, ["random_1"], [1, 0, 2], 2.0)  # cost 1
    write_branch(cdir, ["random_2"], [2, 1, 0], 3.0)  # cost 1
    write_branch(cdir, ["d3"], [0, 2, 1], 1.5)  # cost 0
    bad = cdir / "d3_reverse.json"
    bad.write_text(json.dumps({"names": ["d3_reverse"], "order": [1, 2, 0], "status": "failed", "reason": "nan"}))
    return tmp_path


def test_chunk_summary_hand_built_chunk_gives_hand_computed_z_rank_and_correlation(census_dir):
    entries = collect(census_dir)
    summary = chunk_summary(entries[(2, 2)])
    assert summary["random_mean"] == 2.0 and summary["random_sd"] == 1.0  # random losses 1, 2, 3
    assert summary["marked"]["d3"] == {"loss": 1.5, "z": -0.5, "rank": 2, "beats_median": True}
    assert summary["marked"]["stream"]["z"] == -1.0 and summary["marked"]["stream"]["rank"] == 1
    assert summary["failed"] == ["d3_reverse"] and math.isnan(summary["marked"]["d3_reverse"]["z"])
    # costs (0, 1, 1, 0), losses (1, 2, 3, 1.5) over the distinct finished orders: Σxy 1.25, Σx² 1, Σy² 2.1875
    assert summary["objective"]["pearson"] == pytest.approx(1.25 / math.sqrt(2.1875))
    assert summary["objective"]["n"] == 4


def test_across_chunks_two_chunks_mean_z_and_share_beating_median():
    chunks = [{"random_sd": 1.0, "random_n": 3, "marked": {"d3": {"z": -1.0, "beats_median": True}}},
              {"random_sd": 3.0, "random_n": 3, "marked": {"d3": {"z": 0.0, "beats_median": False}}},
              {"random_sd": float("nan"), "random_n": 0, "marked": {}}]  # a chunk not trained yet: left out
    out = across_chunks(chunks)
    assert out["chunks"] == 2
    assert out["mean_random_sd"] == 2.0
    assert out["d3"]["mean_z"] == -0.5 and out["d3"]["share_beats_median"] == 0.5
    half = 12.706204736174698 * math.sqrt(0.5) / math.sqrt(2.0)  # t_{0.975, 1} · sd / √n
    assert out["d3"]["ci_low"] == pytest.approx(-0.5 - half)


def test_write_report_starts_with_command_and_lists_the_failed_branch(census_dir):
    setup = {"run_dir": "r", "schedule": "random", "L": 3, "checkpoints": [2], "chunks": 1, "random_orders": 3}
    report = write_report(census_dir, "d3ray census r --out o", setup)
    text = (census_dir / "results.md").read_text()
    assert text.startswith("```\nd3ray census r --out o\n```")
    assert "| 2/2 |" in text and "d3_reverse |" in text
    assert json.loads((census_dir / "census.json").read_text())["summary"]["eval"]["d3"]["n"] == 1
    assert report["chunks"]["2/2"]["eval"]["marked"]["d3"]["rank"] == 2
    assert (census_dir / "k00002.png").is_file()


def test_all_orders_hand_built_chunk_gives_regret_share_better_and_random_regret(tmp_path):
    """L = 3, all 6 orders trained (one failed): D3 the second best, its reverse the best; regrets, shares
    of orders better and a random order's expected regret by hand; the report prints the section."""
    from itertools import permutations

    cdir = tmp_path / "branches" / "k00002" / "c00002"
    losses = dict(zip(permutations(range(3)), (3.0, 1.0, 5.0, 2.0, 6.0, float("nan")), strict=True))
    for i, (order, loss) in enumerate(losses.items()):
        names = [f"perm_{i}"] + {(1, 2, 0): ["d3"], (0, 2, 1): ["d3_reverse"], (0, 1, 2): ["random_0"],
                                  (2, 0, 1): ["random_1"], (1, 0, 2): ["random_2"]}.get(order, [])
        if math.isnan(loss):
            cdir.joinpath(f"perm_{i}.json").write_text(json.dumps({"names": names, "order": list(order), "status": "failed"}))
            continue
        write_branch(cdir, names, list(order), loss)
    (cdir / "orders.json").write_text(json.dumps({"d3": [1, 2, 0]}))
    e = chunk_summary(collect(tmp_path)[(2, 2)])["exhaustive"]
    # finished losses 3, 1, 5, 2, 6 (order (2, 1, 0) failed): best 1 at (0, 2, 1), mean 3.4, median 3
    assert (e["orders"], e["failed"], e["best"], e["median"], e["worst"]) == (5, 1, 1.0, 3.0, 6.0)
    assert e["best_order"] == [0, 2, 1]
    assert e["random_regret"] == pytest.approx(2.4)
    assert e["marked"]["d3"] == {"regret": 1.0, "share_better": 0.2}  # loss 2: 1 of the 5 finished orders is lower
    assert e["marked"]["d3_reverse"] == {"regret": 0.0, "share_better": 0.0}  # the best order
    setup = {"run_dir": "r", "schedule": "random", "L": 3, "checkpoints": [2], "chunks": 1, "random_orders": 3,
             "all_orders": True}
    report = write_report(tmp_path, "d3ray census r --out o --all-orders", setup)
    across = report["summary"]["eval"]["exhaustive"]
    assert across["chunks"] == 1 and across["d3"]["regret"]["mean"] == 1.0 and across["mean_range"] == 5.0
    text = (tmp_path / "results.md").read_text()
    assert "### All 6 orders: regret against the true best order" in text
    assert "| 2/2 | 1.0000 | 3.0000 | 6.0000 | 0 2 1 | 1.00000 (0.20) | 0.00000 (0.00) |" in text
