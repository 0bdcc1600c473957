"""``d3ray bench solver`` end to end on tiny sizes: records, targets and the influence family."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from d3ray.lab.bench import solver as bench


def _args(tmp_path: Path, *extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(["--out", str(tmp_path / "out.json"), "--quick", *extra])


def test_bench_solver_tiny_sizes_writes_one_record_per_family_size_solver(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        bench.run(
            _args(tmp_path, "--sizes", "6", "--instances", "1", "--families", "gaussian,planted,influence")
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "influence family skipped" in printed
    data = json.loads((tmp_path / "out.json").read_text())
    keys = {(r["family"], r["L"], r["solver"]) for r in data["records"]}
    solvers = {"row_sum", "greedy_insertion", "rsr", "exact", "ils", "ils@100ms", "ils@rsr"}
    assert keys == {(f, 6, s) for f in ("gaussian", "planted") for s in solvers}
    for record in data["records"]:
        assert record["n"] == 1
        assert record["gap"] >= 0.0
        assert record["seconds"] > 0.0
    exact = [r for r in data["records"] if r["solver"] == "exact"]
    assert all(r["gap"] == 0.0 and r["best_rate"] == 1.0 for r in exact)
    assert {t["family"] for t in data["targets"]} == {"gaussian", "planted"}


def test_bench_solver_influence_dir_loads_stacked_matrices(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    A = rng.normal(size=(3, 6, 6))
    np.save(tmp_path / "s.npy", A - A.transpose(0, 2, 1))
    args = _args(tmp_path, "--families", "influence", "--influence-dir", str(tmp_path))
    assert bench.run(args) == 0
    data = json.loads((tmp_path / "out.json").read_text())
    assert {r["n"] for r in data["records"]} == {3}
    assert {(r["family"], r["L"]) for r in data["records"]} == {("influence", 6)}
