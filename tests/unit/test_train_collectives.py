"""Where collectives put their tensors (d3ray/train/collectives.py): the backend string's device, and a
sum over a real (one-rank, gloo) process group that comes back on the tensor's own device."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from d3ray.train.collectives import all_reduce_sum, backend_device, collective_device


@pytest.mark.parametrize(
    ("backend", "accelerator", "expected"),
    [
        ("cpu:gloo,cuda:nccl", True, "cuda"),  # the GPU runs' backend (run/pretrain.py): reduce where the tensors are
        ("cpu:gloo,cuda:nccl", False, "cpu"),
        ("cuda:nccl,cpu:gloo", True, "cuda"),
        ("nccl", True, "cuda"),
        ("gloo", True, "cpu"),  # a gloo-only group takes CPU tensors even where a GPU exists
        ("gloo", False, "cpu"),
        ("cpu:gloo", True, "cpu"),
    ],
)
def test_backend_device_backend_string_picks_the_groups_device(backend, accelerator, expected):
    assert backend_device(backend, accelerator).type == expected


@pytest.mark.parametrize("backend", ["cuda:nccl", "smoke-signals"])
def test_backend_device_unusable_backend_raises_naming_it(backend):
    with pytest.raises(ValueError, match=backend):
        backend_device(backend, accelerator_available=False)


@pytest.fixture
def gloo_group(tmp_path):
    """A one-rank process group in this process (the map form of the backend string, as the GPU runs use)."""
    dist.init_process_group("cpu:gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_all_reduce_sum_gloo_group_reduces_on_cpu_and_leaves_its_input(gloo_group):
    x = torch.tensor([1.5, -2.0], dtype=torch.float64)
    out = all_reduce_sum(x)
    assert collective_device() == torch.device("cpu")
    assert out.device == x.device and out.dtype == torch.float64
    assert torch.equal(out, x) and out.data_ptr() != x.data_ptr()  # one rank: the sum is the input, copied
