"""``d3ray bench data --quick`` end to end (real Ray Data, a generated corpus): the JSON report holds
the plain loop, the stream, the mixed stream (shared reader) and a lane per domain, and the stream's
tokens are the plain loop's."""

import argparse
import json

import pytest

from d3ray.lab.bench import data as bench
from tests.conftest import start_local_ray

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_bench_data_quick_reports_ratios_and_the_same_tokens(tmp_path):
    start_local_ray()
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(["--quick", "--out", str(tmp_path / "data.json"), "--work-dir", str(tmp_path / "w"),
                              "--batch-size", "4", "--L", "2"])
    assert bench.run(args) == 0
    report = json.loads((tmp_path / "data.json").read_text())
    T, B = report["seq_len"], report["B"]
    for name in ("stream_1", "stream_2"):
        # the stream drops at most the epoch's last incomplete batch of the plain loop's tokens
        assert 0 <= report["tokens_plain_loop"] - report[name]["tokens"] < B * T
        # the ratio is the stream's rate over the plain loop's, both in tokens per second (one rep: the pass's
        # rate is its tokens over its seconds); no bound on the ratio itself, which is the box's load
        ratio = report[name]["ratio_to_plain"]
        assert ratio == pytest.approx(report[name]["tokens_per_sec"] / report["plain_tokens_per_sec"], rel=1e-9)
        assert report[name]["pass_tokens_per_sec"] == pytest.approx(report[name]["tokens"] / report[name]["seconds"])
        assert ratio > 0
    for name in ("mixed_1", "mixed_2", "lanes_1"):  # as many chunks, drawn by domain
        assert report[name]["chunks"] == report["stream_1"]["chunks"]
    assert report["mixed_1"]["moved_to_lanes"] == [] and report["mixed_1"]["queued_sequences_at_end"] >= 0
    assert report["lanes_1"]["queued_sequences_at_end"] == 0  # a lane per domain: no shared queues
    assert len(report["mixture"]) == 2 and abs(sum(report["mixture"].values()) - 1) < 1e-9
    assert [r["fraction"] for r in report["resume"]] == [0.0, 0.5]
    assert report["resume"][1]["tokens_before"] > 0
