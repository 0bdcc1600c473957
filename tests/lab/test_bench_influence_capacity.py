"""``d3ray bench influence-capacity --measured``: the model and tables from saved constants, no measuring."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from d3ray.lab.bench.influence_capacity import add_arguments, run
from tests.lab.capacity_cases import hand_measured


def test_bench_influence_capacity_from_saved_constants_marks_every_projected_row(tmp_path, capsys):
    saved = tmp_path / "saved.json"
    saved.write_text(json.dumps({"measured": asdict(hand_measured())}))
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    out = tmp_path / "capacity.json"
    args = parser.parse_args(["--measured", str(saved), "--out", str(out), "--gpu", "h200",
                              "--gpu-constants", str(tmp_path / "absent.json")])
    assert run(args) == 0
    report = json.loads(out.read_text())
    rows = report["gpus"]["H200 SXM 141GB"]["rows"]
    assert [r["model"] for r in rows] == ["gpt2-124m", "llama-1b", "llama-7b", "llama-70b"]
    assert [r["ranks"] for r in rows] == [8, 8, 64, 512]
    assert report["gpus"]["H200 SXM 141GB"]["projected_fields"]
    printed = capsys.readouterr().out
    table = printed[printed.index("== H200"):]
    for name in ("gpt2-124m", "llama-70b"):
        line = next(x for x in table.splitlines() if x.startswith(name))
        assert "~" in line  # every row of a projected device carries the projection mark
    # the hand GPT-2 (tied: V·h = 40 twice in the state dict) in bfloat16: 2·(304 + 40) + 2·2·304 = 1904
    assert report["this_machine"][0]["snapshot"]["bytes_per_chunk"] == 1904
    assert report["load"]["estimator"] == "drift"
    cost = rows[0]["chunk_cost"]  # gpt2-124m on H200, the default estimator
    assert cost["actor_sec"] > cost["host_to_device_sec"] > 0 and cost["actor_share"] > 0
    assert "chunk cost" in table and "potential ms/batch" in table
    measured = printed[printed.index("== measured"):printed.index("== the model")]
    assert "potential ms" in measured and "hand" in measured
