"""The recency control at its two horizons, from branch files written by hand, and the momentum arithmetic
that says why the horizon matters under AdamW."""

from __future__ import annotations

import json

import pytest

from d3ray.census.analysis import collect, recency_control
from d3ray.census.report import write_report
from d3ray.census.stats import momentum_applied


def test_momentum_applied_exact_small_cases():
    assert momentum_applied(1, 8, 0.9) == pytest.approx(1 - 0.9**8)  # 0.570: the first batch had 8 steps
    assert momentum_applied(8, 8, 0.9) == pytest.approx(0.1)  # the last batch: one step of (1 − β1)
    assert momentum_applied(8, 8, 0.9, extra_steps=16) == pytest.approx(1 - 0.9**17)
    assert momentum_applied(3, 4, 0.5) == pytest.approx(0.75)
    assert momentum_applied(4, 4, 0.0) == 1.0  # no momentum: every step applied at once
    with pytest.raises(ValueError, match="position 0"):
        momentum_applied(0, 8, 0.9)
    with pytest.raises(ValueError, match="beta1"):
        momentum_applied(1, 8, 1.0)


def test_momentum_applied_equals_the_summed_momentum_weights():
    beta1, L, extra = 0.9, 8, 5
    for position in range(1, L + 1):
        steps = L - position + 1 + extra
        summed = sum((1 - beta1) * beta1**k for k in range(steps))
        assert momentum_applied(position, L, beta1, extra) == pytest.approx(summed)


def _branch(cdir, name, order, eval_c4, persist_c4):
    result = {"names": [name], "order": order, "status": "ok",
              "eval": {"mean_loss": eval_c4, "c4/loss": eval_c4},
              "persist_eval": {"mean_loss": persist_c4, "c4/loss": persist_c4}}
    (cdir / f"{name}.json").write_text(json.dumps(result))


def recency_census(root):
    """Three chunks of L = 4 whose batches hold 0, 1, 2, 3 c4 sequences: recency_last (0, 1, 2, 3) is
    worse than every random order right after the chunk and better after the persist chunks."""
    domains = [["web"] * 3, ["c4"] + ["web"] * 2, ["c4"] * 2 + ["web"], ["c4"] * 3]
    randoms = [[1, 0, 2, 3], [3, 2, 0, 1], [2, 3, 1, 0], [0, 3, 2, 1], [1, 3, 0, 2]]
    for c, eps in zip((10, 11, 12), (0.0, 0.001, -0.001), strict=True):
        cdir = root / "branches" / "k00010" / f"c{c:05d}"
        cdir.mkdir(parents=True)
        (cdir / "orders.json").write_text(json.dumps({"batch_domains": domains}))
        for i, order in enumerate(randoms):
            _branch(cdir, f"random_{i}", order, 2.0 + 0.01 * i + eps, 1.5 + 0.01 * i + eps)
        _branch(cdir, "recency_last", [0, 1, 2, 3], 2.1, 1.4)
        _branch(cdir, "recency_first", [3, 2, 1, 0], 1.9, 1.6)


def test_recency_control_reads_each_horizon_and_finds_it_only_where_the_effect_is(tmp_path):
    recency_census(tmp_path)
    entries = collect(tmp_path)
    soon, later = recency_control(entries, None), recency_control(entries, None, "persist_eval")
    assert soon["chunks"]["10/10"]["domain"] == "c4"
    assert soon["recency_last"]["mean_z"] > 2 and not soon["found"]
    assert later["recency_last"]["mean_z"] < -2 and later["recency_last"]["ci_high"] < 0 and later["found"]
    assert later["recency_last"]["share_past_2"] == 1.0 and later["recency_first"]["mean_z"] > 2

    setup = {"run_dir": "r", "schedule": "random", "L": 4, "checkpoints": [10], "chunks": 3, "random_orders": 5,
             "persist": 2, "control": "recency", "beta1": 0.9}
    write_report(tmp_path, "d3ray census r --out o --control recency --persist 2", setup)
    saved = json.loads((tmp_path / "census.json").read_text())["control"]
    assert saved["recency"]["found"] is False and saved["recency_persist"]["found"] is True
    text = (tmp_path / "results.md").read_text()
    assert "## Positive control: recency, right after the branched chunk" in text
    assert "## Positive control: recency, after 2 more shared chunks" in text
    assert text.count("**Control NOT found**") == 1 and text.count("**Control found**") == 1
    # β1 = 0.9, L = 4: first batch 1 − 0.9^4 = 0.34, last 0.10; after 8 more steps 0.72 and 0.61
    assert "is 0.34 for the first batch of the chunk and 0.10 for the last" in text
    assert "is 0.72 for the first batch of the chunk and 0.61 for the last" in text

