"""The planted-batch control: the planting (tokens in, tokens out), the position-effect statistic, the
report from branch files written by hand (a known answer each way), and the census directory check."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from d3ray.data.chunker import GlobalBatch
from d3ray.errors import UserError
from d3ray.lab.census.analysis import planted_control
from d3ray.lab.census.census import CensusOptions, check_inputs, check_out_dir, chunk_orders, load_run
from d3ray.lab.census.planted import plant_chunk, plant_tokens, planted_index, planted_orders, planting
from d3ray.lab.census.report import write_report
from d3ray.lab.census.stats import half_of, position_effect
from tests.lab.test_census_inputs import write_run


def test_plant_tokens_shuffled_permutes_each_rows_real_tokens_and_keeps_padding():
    ids = np.array([[5, 6, 7, 0, 0], [1, 2, 3, 4, 9]], dtype=np.int32)
    n = np.array([3, 5])
    out = plant_tokens(ids, n, "shuffled", [0, 1])
    assert out.dtype == ids.dtype and out.shape == ids.shape
    assert sorted(out[0, :3]) == [5, 6, 7] and list(out[0, 3:]) == [0, 0]  # padding kept in place
    assert sorted(out[1]) == [1, 2, 3, 4, 9]
    assert ids.tolist() == [[5, 6, 7, 0, 0], [1, 2, 3, 4, 9]]  # the input is not modified
    assert (plant_tokens(ids, n, "shuffled", [0, 1]) == out).all()  # deterministic by seed
    long = np.arange(1, 65, dtype=np.int64).reshape(2, 32)
    a, b = plant_tokens(long, np.array([32, 20]), "shuffled", 1), plant_tokens(long, np.array([32, 20]), "shuffled", 2)
    assert not (a == long).all() and not (a == b).all()  # a real shuffle, and another one for another seed
    assert (a[1, 20:] == long[1, 20:]).all() and sorted(a[1, :20]) == list(long[1, :20])


def test_plant_tokens_repeated_one_id_from_the_batch_over_every_real_token():
    ids = np.array([[5, 6, 7, 0], [8, 9, 0, 0]], dtype=np.int32)
    out = plant_tokens(ids, np.array([3, 2]), "repeated", 7)
    real = out[[0, 0, 0, 1, 1], [0, 1, 2, 0, 1]]
    assert len(set(real.tolist())) == 1 and real[0] in {5, 6, 7, 8, 9}
    assert out[0, 3] == 0 and list(out[1, 2:]) == [0, 0]
    with pytest.raises(ValueError, match="planted kind"):
        plant_tokens(ids, np.array([3, 2]), "reversed", 0)


def test_plant_chunk_changes_only_the_planted_batchs_tokens():
    rng = np.random.default_rng(0)
    batches = [GlobalBatch(input_ids=rng.integers(1, 50, size=(2, 8)).astype(np.int32), n_tokens=np.array([8, 5]),
                           sample_ids=(f"{i}/0", f"{i}/1"), domains=("a", "b"),
                           loss_mask=np.tile(np.arange(8) % 2 == 0, (2, 1))) for i in range(3)]
    plant = planting("shuffled", 3, seed=0, chunk_id=4, fixed=1)
    assert plant == {"kind": "shuffled", "index": 1, "seed": [0, 4]}
    out = plant_chunk(batches, plant)
    assert out[0] is batches[0] and out[2] is batches[2] and out[1] is not batches[1]
    assert not (out[1].input_ids == batches[1].input_ids).all()
    assert (out[1].n_tokens == batches[1].n_tokens).all() and (out[1].loss_mask == batches[1].loss_mask).all()
    assert out[1].sample_ids == batches[1].sample_ids and out[1].domains == batches[1].domains
    for row, n in enumerate(batches[1].n_tokens):
        assert sorted(out[1].input_ids[row, :n]) == sorted(batches[1].input_ids[row, :n])
        assert (out[1].input_ids[row, n:] == batches[1].input_ids[row, n:]).all()
    assert (plant_chunk(batches, plant)[1].input_ids == out[1].input_ids).all()


def test_planted_index_fixed_or_seeded_and_the_two_control_orders():
    assert planted_index(8, 0, 5, fixed=3) == 3
    draws = [planted_index(8, 0, c) for c in range(40)]
    assert draws == [planted_index(8, 0, c) for c in range(40)] and set(draws) == set(range(8))
    with pytest.raises(ValueError, match="0..7"):
        planted_index(8, 0, 5, fixed=8)
    assert planted_orders(4, 2) == {"planted_first": (2, 0, 1, 3), "planted_last": (0, 1, 3, 2)}


def test_position_effect_hand_made_losses_rising_and_falling_with_position():
    assert [half_of(p, 5) for p in range(1, 6)] == ["early", "early", "middle", "late", "late"]
    up = position_effect([1, 2, 3, 4, 2], [1.0, 2.0, 3.0, 4.0, 2.0], L=4)
    assert up["spearman"] == pytest.approx(1.0) and up["pearson"] == pytest.approx(1.0)
    assert up["early_mean"] == pytest.approx(5 / 3) and up["late_mean"] == pytest.approx(3.5)
    assert up["better"] == "early" and up["n"] == 5
    down = position_effect([1, 3, 5, 2, 4], [5.0, 3.0, 1.0, 4.0, float("nan")], L=5)  # a failed branch dropped
    assert down["n"] == 4 and down["spearman"] == pytest.approx(-1.0) and down["better"] == "late"
    assert down["early_mean"] == pytest.approx(4.5) and down["late_mean"] == pytest.approx(1.0)  # position 3: middle
    flat = position_effect([1, 2, 3], [1.0, 1.0, 1.0], L=3)
    assert math.isnan(flat["spearman"]) and flat["better"] is None


def write_branch(cdir, names, order, loss):
    cdir.mkdir(parents=True, exist_ok=True)
    result = {"names": names, "order": order, "status": "ok", "eval": {"mean_loss": loss}, "train_losses": [loss]}
    (cdir / f"{names[0]}.json").write_text(json.dumps(result))


def planted_census(root, slope: float, noise: tuple[float, ...]) -> None:
    """Three chunks of L = 4, batch 2 planted; random-order losses 1 + slope · position (+ noise); D3 puts the
    planted batch first, so its reverse puts it last."""
    randoms = [[2, 0, 1, 3], [0, 2, 1, 3], [0, 1, 2, 3], [0, 1, 3, 2], [3, 1, 0, 2]]  # batch 2 at 1, 2, 3, 4, 4
    for c, eps in zip((10, 11, 12), noise, strict=True):
        cdir = root / "branches" / "k00010" / f"c{c:05d}"
        cdir.mkdir(parents=True)
        plant = {"kind": "shuffled", "index": 2, "seed": [0, c]}
        (cdir / "orders.json").write_text(json.dumps({"d3": [2, 3, 0, 1], "planted": plant}))
        for i, order in enumerate(randoms):
            position = order.index(2) + 1
            write_branch(cdir, [f"random_{i}"], order, 1.0 + slope * position + (eps if i == 0 else 0.0))
        write_branch(cdir, ["d3", "planted_first"], [2, 3, 0, 1], 1.0 + slope)
        write_branch(cdir, ["d3_reverse"], [1, 0, 3, 2], 1.0 + 4 * slope)
        write_branch(cdir, ["planted_last"], [0, 1, 3, 2], 1.0 + 4 * slope)


def test_planted_control_finds_early_better_and_d3_on_that_side(tmp_path):
    planted_census(tmp_path, slope=0.01, noise=(0.0, 0.001, -0.001))
    from d3ray.lab.census.analysis import collect

    control = planted_control(collect(tmp_path), L=4)
    row = control["chunks"]["10/10"]
    assert row["positions"] == [1, 2, 3, 4, 4] and row["spearman"] == pytest.approx(1.0)
    assert row["early_mean"] == pytest.approx(1.015) and row["late_mean"] == pytest.approx((1.03 + 1.04 + 1.04) / 3)
    assert row["d3"]["position"] == 1 and row["d3"]["side"] == "early" and row["d3"]["better_side"] is True
    assert row["d3_reverse"]["position"] == 4 and row["d3_reverse"]["better_side"] is False
    assert row["planted_first"]["z"] < 0 < row["planted_last"]["z"]
    assert control["found"] and control["better"] == "early" and control["spearman"]["n"] == 3
    assert control["spearman"]["ci_low"] > 0 and control["late_minus_early"]["mean"] == pytest.approx(0.11 / 3 - 0.015)
    assert control["d3"]["better_side"] == 1.0 and control["d3"]["found_side"] == 1.0
    assert control["d3_reverse"]["better_side"] == 0.0 and control["d3"]["mean_position"] == 1.0

    setup = {"run_dir": "r", "schedule": "random", "L": 4, "checkpoints": [10], "chunks": 3, "random_orders": 5,
             "control": "planted", "planted_kind": "shuffled"}
    write_report(tmp_path, "d3ray census r --out o --control planted", setup)
    saved = json.loads((tmp_path / "census.json").read_text())["control"]["planted"]
    assert saved["found"] is True and saved["better"] == "early"
    text = (tmp_path / "results.md").read_text()
    assert "## Positive control: planted batch" in text and "**Control found**" in text
    assert "it says the batch should go **early** (as expected)" in text
    assert "| 10/11 | 2 | 5 | 1.00 |" in text


def test_planted_control_not_found_when_position_does_not_move_the_loss(tmp_path):
    # slope 0: the only differences are noise on one order of each chunk, of mixed sign → interval holds 0
    planted_census(tmp_path, slope=0.0, noise=(0.003, -0.002, 0.001))
    write_report(tmp_path, "d3ray census r --out o --control planted",
                 {"run_dir": "r", "schedule": "random", "L": 4, "checkpoints": [10], "chunks": 3, "random_orders": 5,
                  "control": "planted"})
    control = json.loads((tmp_path / "census.json").read_text())["control"]["planted"]
    assert control["found"] is False and control["spearman"]["ci_low"] < 0 < control["spearman"]["ci_high"]
    assert "**Control NOT found**" in (tmp_path / "results.md").read_text()


def test_check_out_dir_refuses_mixing_planted_and_unplanted_chunks(tmp_path):
    out = tmp_path / "census"
    cdir = out / "branches" / "k00001" / "c00001"
    cdir.mkdir(parents=True)
    (cdir / "orders.json").write_text(json.dumps({"S": [], "d3": None}))  # an unplanted census
    check_out_dir(CensusOptions(run_dir=tmp_path, out=out), L=4)
    with pytest.raises(UserError, match="holds chunk 1 with unplanted chunks.*shuffled batch planted at stream index 3"):
        check_out_dir(CensusOptions(run_dir=tmp_path, out=out, control="planted", planted_batch=3), L=4)
    (cdir / "orders.json").write_text(json.dumps({"planted": planting("shuffled", 4, 0, 1, 3)}))
    check_out_dir(CensusOptions(run_dir=tmp_path, out=out, control="planted", planted_batch=3), L=4)
    for other in (CensusOptions(run_dir=tmp_path, out=out, control="planted", planted_batch=2),
                  CensusOptions(run_dir=tmp_path, out=out, control="planted", planted_batch=3, planted_kind="repeated"),
                  CensusOptions(run_dir=tmp_path, out=out, control="recency")):
        with pytest.raises(UserError, match="an --out of its own"):
            check_out_dir(other, L=4)


def test_check_inputs_planted_options_and_chunk_orders_add_the_two_control_orders(tmp_path):
    run = write_run(tmp_path / "rand", ["--schedule.type=random", "--schedule.L=4", "--train.steps=16",
                                        "--train.zero_stage=0"], [1, 2])
    info = load_run(run)
    with pytest.raises(UserError, match=r"--planted-batch 4 is not a stream index .*\(0\.\.3\)"):
        check_inputs(info, CensusOptions(run_dir=run, out=tmp_path / "o", control="planted", planted_batch=4))
    with pytest.raises(UserError, match="belong to --control planted"):
        check_inputs(info, CensusOptions(run_dir=run, out=tmp_path / "o", planted_kind="repeated"))
    options = CensusOptions(run_dir=run, out=tmp_path / "o", control="planted", checkpoints=[1], random_orders=2)
    assert check_inputs(info, options) == [1]
    named = chunk_orders(options, 4, 1, 1, None, {"d3": [3, 2, 1, 0], "planted": planting("shuffled", 4, 0, 1, 1)})
    assert named["planted_first"] == (1, 0, 2, 3) and named["planted_last"] == (0, 2, 3, 1)
    assert named["d3"] == (3, 2, 1, 0) and "random_1" in named
