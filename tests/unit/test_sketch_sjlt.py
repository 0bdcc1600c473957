"""JL sketches: exact structure, determinism across processes, shards, unbiased inner products."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from d3ray.influence.config import GaussianSketchConfig, IdentitySketchConfig, SjltSketchConfig
from d3ray.influence.sketch import SparseJLSketch, splitmix64, stable_seed

MASK64 = (1 << 64) - 1



def _splitmix64_reference(x: int) -> int:
    """The uint64 finaliser in plain Python integers."""
    z = x & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def _named(rng: np.random.Generator, n: int = 3) -> dict[str, torch.Tensor]:
    return {
        "layer.weight": torch.tensor(rng.normal(size=(n, 7, 5))),
        "layer.bias": torch.tensor(rng.normal(size=(n, 5))),
        "emb": torch.tensor(rng.normal(size=(n, 300))),
    }


def test_splitmix64_int64_tensor_matches_uint64_reference():
    values = [0, 1, 2**40 + 7, 2**62 + 12345, 2**63 - 1]
    as_int64 = torch.tensor([v if v < 2**63 else v - 2**64 for v in values], dtype=torch.int64)

    got = [int(v) & MASK64 for v in splitmix64(as_int64)]

    assert got == [_splitmix64_reference(v) for v in values]


def test_stable_seed_equal_in_processes_with_other_hash_salts_and_differs_by_part():
    """Actors in other processes must draw the same sketch: Python's ``hash`` would differ there."""
    import os
    import subprocess
    import sys

    code = "from d3ray.influence.sketch import stable_seed; print(stable_seed('sjlt', 0, 'w'), hash('w'))"
    outs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": salt}).stdout.split() for salt in ("1", "2")]
    assert outs[0][1] != outs[1][1], "the two processes salt hash() differently"
    assert int(outs[0][0]) == int(outs[1][0]) == stable_seed("sjlt", 0, "w")
    assert stable_seed("sjlt", 0, "w") != stable_seed("sjlt", 1, "w")
    assert 0 <= stable_seed("x") < 2**63


def test_sjlt_rows_one_per_block_and_unit_signs():
    sketch = SparseJLSketch(k=10, s=3, seed=5)

    rows, signs = sketch.rows_and_signs("w", 0, 1000)

    # Blocks of sizes 4, 3, 3 start at rows 0, 4, 7.
    assert rows.shape == (1000, 3)
    assert rows[:, 0].min() >= 0 and rows[:, 0].max() <= 3
    assert rows[:, 1].min() >= 4 and rows[:, 1].max() <= 6
    assert rows[:, 2].min() >= 7 and rows[:, 2].max() <= 9
    assert set(signs.unique().tolist()) == {-1, 1}
    assert abs(float(signs.double().mean())) < 0.1  # 3000 fair signs: |mean| ≤ 0.1 is > 5 sd


@pytest.mark.parametrize("cache_bytes", [1 << 30, 0], ids=["sparse-product", "scatter"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_sjlt_projection_equals_explicit_matrix(cache_bytes, dtype):
    """Both ways of applying P (a cached CSR product, or the scatter when the cache has no room) are P."""
    sketch = SparseJLSketch(k=12, s=2, seed=3, cache_bytes=cache_bytes)
    v = torch.randn(2, 40, dtype=dtype)
    rows, signs = sketch.rows_and_signs("v", 0, 40)
    P = torch.zeros(12, 40, dtype=torch.float64)
    for c in range(40):
        for b in range(2):
            P[rows[c, b], c] += float(signs[c, b]) / np.sqrt(2)

    got = sketch.project({"v": v})
    tail = sketch.project({"v": v[:, 15:]}, offsets={"v": 15})  # a shard's slice, hashed at its offset

    atol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(got, v @ P.to(dtype).T, rtol=0, atol=atol)
    torch.testing.assert_close(tail, v[:, 15:] @ P[:, 15:].to(dtype).T, rtol=0, atol=atol)
    assert bool(sketch._cache._entries) == (cache_bytes > 0)


def test_identity_sketch_preserves_inner_products_exactly():
    rng = np.random.default_rng(0)
    vectors = _named(rng)
    sketch = IdentitySketchConfig().build()

    P = sketch.project(vectors)

    flat = torch.cat([v.reshape(3, -1) for v in vectors.values()], dim=1)
    assert torch.equal(P @ P.T, flat @ flat.T)
    assert sketch.dim({n: v[0].numel() for n, v in vectors.items()}) == P.shape[1]


@pytest.mark.parametrize(
    "config", [SjltSketchConfig(k=64, s=4, seed=7), GaussianSketchConfig(k=64, seed=7, block_size=32)]
)
def test_sketch_shards_sum_to_whole_parameter(config):
    sketch = config.build()
    v = torch.randn(2, 100, dtype=torch.float64)

    whole = sketch.project({"p": v})
    shards = sketch.project({"p": v[:, :37]}) + sketch.project({"p": v[:, 37:]}, offsets={"p": 37})

    torch.testing.assert_close(shards, whole, rtol=0, atol=1e-12)


def test_sketch_does_not_depend_on_parameter_order_or_other_parameters():
    rng = np.random.default_rng(1)
    vectors = _named(rng)
    sketch = SjltSketchConfig(k=32, seed=2).build()

    full = sketch.project(vectors)
    reversed_order = sketch.project(dict(reversed(list(vectors.items()))))
    parts = sum(sketch.project({n: v}) for n, v in vectors.items())

    torch.testing.assert_close(reversed_order, full, rtol=0, atol=1e-12)
    torch.testing.assert_close(parts, full, rtol=0, atol=1e-12)


_CHILD = """
import numpy as np, torch
from d3ray.influence.config import SjltSketchConfig, GaussianSketchConfig
v = torch.tensor(np.random.default_rng(3).normal(size=(2, 500)))
a = SjltSketchConfig(k=50, s=2, seed=11).build().project({"x.weight": v})
b = GaussianSketchConfig(k=20, seed=11, block_size=64).build().project({"x.weight": v})
print(torch.cat([a, b], 1).numpy().tobytes().hex())
"""


def test_sketch_same_seed_identical_in_two_processes():
    outs = [
        subprocess.run(
            [sys.executable, "-c", _CHILD],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        ).stdout
        for _ in range(2)
    ]
    v = torch.tensor(np.random.default_rng(3).normal(size=(2, 500)))
    here = torch.cat(
        [
            SjltSketchConfig(k=50, s=2, seed=11).build().project({"x.weight": v}),
            GaussianSketchConfig(k=20, seed=11, block_size=64).build().project({"x.weight": v}),
        ],
        1,
    )

    assert outs[0] == outs[1] == here.numpy().tobytes().hex() + "\n"


@pytest.mark.parametrize(
    "make",
    [lambda seed: SjltSketchConfig(k=16, s=2, seed=seed), lambda seed: GaussianSketchConfig(k=16, seed=seed)],
)
def test_sketch_inner_product_mean_over_seeds_within_four_standard_errors(make):
    rng = np.random.default_rng(4)
    u = torch.tensor(rng.normal(size=(1, 200)))
    v = u + torch.tensor(rng.normal(size=(1, 200)))
    exact = float(u @ v.T)
    seeds = 300

    estimates = np.array(
        [
            float((lambda P: P[0] @ P[1])(make(s).build().project({"x": torch.cat([u, v])})))
            for s in range(seeds)
        ]
    )

    # JL variance of ⟨Pu, Pv⟩ is about (‖u‖²‖v‖² + ⟨u, v⟩²)/k; the bound uses the sample sd.
    stderr = estimates.std(ddof=1) / np.sqrt(seeds)
    assert abs(estimates.mean() - exact) <= 4 * stderr
    assert estimates.std() < 2 * np.sqrt((float(u @ u.T) * float(v @ v.T) + exact**2) / 16)
