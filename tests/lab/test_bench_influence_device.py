"""``d3ray bench influence --device``: cpu by default (the figures as before), cuda only where torch sees one."""

from __future__ import annotations

import pytest
import torch

from d3ray.cli import main, parse_args


def test_bench_influence_device_defaults_to_cpu():
    assert parse_args(["bench", "influence", "--quick"]).device == "cpu"
    assert parse_args(["bench", "influence", "--device", "cuda"]).device == "cuda"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this box has a CUDA device")
def test_bench_influence_device_cuda_without_gpu_stops_in_one_line(tmp_path, capsys):
    code = main(["bench", "influence", "--quick", "--device", "cuda", "--workdir", str(tmp_path),
                 "--data", str(tmp_path / "no-data")])
    err = capsys.readouterr().err
    assert code == 2
    assert "--device cuda: torch sees no CUDA device here" in err and "use --device cpu" in err
    assert not any(tmp_path.iterdir()), "it stopped before reading data or training"
