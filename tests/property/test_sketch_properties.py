"""Properties of sketches and influence matrices over random inputs (Hypothesis)."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from d3ray.influence.config import GaussianSketchConfig, SjltSketchConfig
from d3ray.influence.control_variate import ControlVariate, Reference
from d3ray.influence.influence import influence_matrices
from d3ray.influence.sketch import IdentitySketch

SETTINGS = settings(max_examples=25, deadline=None)



@st.composite
def sjlt_configs(draw) -> SjltSketchConfig:
    k = draw(st.integers(1, 40))
    return SjltSketchConfig(k=k, s=draw(st.integers(1, min(4, k))), seed=draw(st.integers(0, 2**31)))


sketch_configs = st.one_of(
    sjlt_configs(),
    st.builds(
        GaussianSketchConfig, k=st.integers(1, 24), seed=st.integers(0, 2**31), block_size=st.integers(1, 50)
    ),
)


@SETTINGS
@given(
    config=sketch_configs,
    d=st.integers(1, 120),
    seed=st.integers(0, 2**31),
    a=st.floats(-3, 3),
    b=st.floats(-3, 3),
)
def test_sketch_is_linear(config, d, seed, a, b):
    rng = np.random.default_rng(seed)
    u, v = (torch.tensor(rng.normal(size=(1, d))) for _ in range(2))
    sketch = config.build()

    combined = sketch.project({"p": a * u + b * v})
    separate = a * sketch.project({"p": u}) + b * sketch.project({"p": v})

    torch.testing.assert_close(combined, separate, rtol=1e-10, atol=1e-10)


@SETTINGS
@given(config=sketch_configs, d=st.integers(2, 120), data=st.data())
def test_sketch_shards_cut_anywhere_sum_to_whole(config, d, data):
    cut = data.draw(st.integers(1, d - 1))
    v = torch.tensor(np.random.default_rng(d).normal(size=(2, d)))
    sketch = config.build()

    shards = sketch.project({"p": v[:, :cut]}) + sketch.project({"p": v[:, cut:]}, offsets={"p": cut})

    torch.testing.assert_close(shards, sketch.project({"p": v}), rtol=1e-10, atol=1e-10)


matrices = st.tuples(st.integers(1, 9), st.integers(1, 20), st.integers(0, 2**31), st.floats(1e-4, 10.0))


@SETTINGS
@given(shape_seed_gamma=matrices)
def test_influence_s_exactly_antisymmetric_and_first_order_zero(shape_seed_gamma):
    L, k, seed, gamma = shape_seed_gamma
    rng = np.random.default_rng(seed)
    G, Q, H = (rng.normal(size=(L, k)) * rng.uniform(0.01, 100) for _ in range(3))

    A, S = influence_matrices(G, Q, H, gamma)
    _, S_first = influence_matrices(G, np.zeros_like(Q), np.zeros_like(H), gamma)

    assert np.array_equal(S, -S.T)
    assert np.all(S_first == 0)
    np.testing.assert_allclose(S, A.T - A, rtol=1e-9, atol=1e-9 * np.abs(A).max())


@SETTINGS
@given(n=st.integers(1, 5), d=st.integers(1, 60), seed=st.integers(0, 2**31))
def test_control_variate_with_identity_sketch_is_exact(n, d, seed):
    rng = np.random.default_rng(seed)
    stats = {s: {"p": torch.tensor(rng.normal(size=(n, d)))} for s in ("g", "q", "h")}
    reference = Reference(vectors={s: {"p": rng.normal(size=d)} for s in ("g", "q", "h")})
    sketch = IdentitySketch()

    rows = ControlVariate(reference, sketch, torch.device("cpu"), torch.float64).augment(
        stats, {s: sketch.project(v) for s, v in stats.items()}
    )

    for a, b in (("g", "g"), ("q", "h")):
        torch.testing.assert_close(
            rows[a] @ rows[b].T, stats[a]["p"] @ stats[b]["p"].T, rtol=1e-9, atol=1e-9 * d
        )
