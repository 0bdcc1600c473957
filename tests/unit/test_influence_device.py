"""The sketch and influence math run where their inputs are: on the ``meta`` device (shapes and devices
only, no data), every tensor an op makes stays there: no ``.numpy()``, no CPU tensor made mid-way (what
would cost a host round trip per batch, or fail, on a GPU). A dispatch mode sees every op's outputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from d3ray.influence.chunk import batch_vectors, sketch_rows
from d3ray.influence.config import InfluenceConfig, SjltSketchConfig
from d3ray.influence.optimizer import AdamWState, step_direction
from d3ray.influence.sketch import IdentitySketch, SparseJLSketch
from d3ray.influence.statistics import BatchStatistics

META = torch.device("meta")
SHAPES = {"wte": (12, 4), "ln.bias": (4,)}


class _HostTensorWatch(TorchDispatchMode):
    """Records every op whose output is a tensor off the watched device (e.g. a CPU tensor)."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device, self.strays = device, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        flat = out if isinstance(out, (tuple, list)) else (out,)
        self.strays += [str(func) for t in flat if torch.is_tensor(t) and t.device.type != self.device.type]
        return out


def _meta(shapes, n=None):
    return {name: torch.empty(((n,) if n else ()) + shape, device=META) for name, shape in shapes.items()}


@pytest.mark.parametrize("sketch", [SparseJLSketch(k=8, s=2, seed=1), IdentitySketch()], ids=["sjlt", "identity"])
def test_sketch_project_meta_vectors_stay_on_their_device(sketch):
    offsets = {"wte": 24} if isinstance(sketch, SparseJLSketch) else None  # a shard's slice: hashed at its offset
    with _HostTensorWatch(META) as watch:
        out = sketch.project(_meta(SHAPES, n=3), offsets)
    k = sketch.dim({n: int(np.prod(s)) for n, s in SHAPES.items()})
    assert out.device == META and tuple(out.shape) == (3, k)
    assert watch.strays == []


def test_sjlt_rows_and_signs_hashed_on_meta_match_cpu_shapes():
    sketch = SparseJLSketch(k=8, s=2, seed=1)
    with _HostTensorWatch(META) as watch:
        rows, signs = sketch.rows_and_signs("wte", 5, 17, device=META)
    cpu_rows, cpu_signs = sketch.rows_and_signs("wte", 5, 17)
    assert rows.device == META and signs.device == META and watch.strays == []
    assert rows.shape == cpu_rows.shape == signs.shape == cpu_signs.shape == (12, 2)


def test_adam_step_and_sketch_rows_on_meta_make_no_host_tensor():
    """The in-trainer path on a GPU: θ, g, h and the optimizer's own m, v slices all on the device."""
    config = InfluenceConfig(preconditioner="adam", control_variate=True, sketch=SjltSketchConfig(k=8, s=2))
    state = AdamWState(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, step=3, max_grad_norm=1.0,
                       exp_avg=_meta(SHAPES), exp_avg_sq=_meta(SHAPES))
    params, stats = _meta(SHAPES), BatchStatistics(loss=1.0, grad=_meta(SHAPES), hdiag=_meta(SHAPES), finite=True)
    sketch = config.sketch.build()  # its constructor's small CPU tables are not per batch
    with _HostTensorWatch(META) as watch:
        moments = state.tensors(params, META, torch.float32)
        eta, u = step_direction("adam", 0.1, params, stats.grad, state, moments)  # the clip included
        _, vecs = batch_vectors(stats, params, config, state, moments)
        rows = sketch_rows(vecs, sketch, None, config.control_variate)
    assert watch.strays == []
    assert eta == 1e-3 and all(t.device == META and t.shape == SHAPES[n] for n, t in u.items())
    assert sorted(rows) == ["g", "h", "q", "u"]
    assert all(r.device == META and tuple(r.shape) == (8 + 3,) for r in rows.values())  # k + the control variate's 3
