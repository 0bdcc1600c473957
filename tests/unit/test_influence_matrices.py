"""A and S from per-batch statistics: a case worked out by hand, exclusion of bad batches, merging parts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from d3ray.influence.config import InfluenceConfig, SjltSketchConfig
from d3ray.influence.estimators import hutchinson_samples
from d3ray.influence.influence import (
    BatchSketches,
    LookaheadRows,
    influence_from_lookahead,
    influence_from_sketches,
    influence_matrices,
)
from d3ray.influence.sketch import IdentitySketch

# Three quadratic batch losses ℓ_i(θ) = ½ Σ_c D_i[c] (θ_c − c_i[c])² at θ = (1, 1): g_i = D_i ⊙ (θ − c_i)
# and the Hessian is diag(D_i), which Hutchinson recovers exactly (z ⊙ D z = D since z² = 1).
THETA = [1.0, 1.0]
CURVATURES = [[1.0, 2.0], [2.0, 1.0], [1.0, 1.0]]
CENTRES = [[0.0, 0.0], [0.0, 2.0], [2.0, 0.0]]
GAMMA = 0.5
# By hand: g = (1, 2), (2, −1), (−1, 1); q = g² = (1, 4), (4, 1), (1, 1); h = D.
# G Gᵀ = [[5, 0, 1], [0, 5, −3], [1, −3, 2]];  M = Q Hᵀ = [[9, 6, 5], [6, 9, 5], [3, 3, 2]];
# A = −0.5·G Gᵀ + 0.125·M.
A_BY_HAND = np.array(
    [
        [-1.375, 0.75, 0.125],
        [0.75, -1.375, 2.125],
        [-0.125, 1.875, -0.75],
    ]
)
S_BY_HAND = np.array([[0.0, 0.0, -0.25], [0.0, 0.0, -0.25], [0.25, 0.25, 0.0]])



def _quadratic_rows() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    sketch = IdentitySketch()
    rows = {"g": [], "q": [], "h": []}
    for D, c in zip(CURVATURES, CENTRES, strict=True):
        theta = {"w": torch.tensor(THETA, dtype=torch.float64, requires_grad=True)}
        D_t, c_t = torch.tensor(D, dtype=torch.float64), torch.tensor(c, dtype=torch.float64)
        loss_fn = lambda p, D_t=D_t, c_t=c_t: 0.5 * (D_t * (p["w"] - c_t) ** 2).sum()  # noqa: E731
        _, g, (h,) = hutchinson_samples(loss_fn, theta, probes=1, generator=torch.Generator().manual_seed(0))
        rows["g"].append(sketch.project({"w": g["w"][None]})[0])
        rows["q"].append(sketch.project({"w": (g["w"] ** 2)[None]})[0])
        rows["h"].append(sketch.project({"w": h["w"][None]})[0])
    return tuple(torch.stack(rows[s]).numpy() for s in ("g", "q", "h"))


def test_influence_matrices_three_quadratic_batches_match_hand_values():
    G, Q, H = _quadratic_rows()

    A, S = influence_matrices(G, Q, H, GAMMA)

    np.testing.assert_allclose(A, A_BY_HAND, rtol=0, atol=1e-12)
    np.testing.assert_allclose(S, S_BY_HAND, rtol=0, atol=1e-12)


def test_influence_matrices_random_rows_give_exactly_antisymmetric_s():
    rng = np.random.default_rng(0)
    G, Q, H = (rng.normal(size=(7, 33)).astype(np.float32) for _ in range(3))

    A, S = influence_matrices(G, Q, H, 0.3)

    assert np.array_equal(S, -S.T)
    assert np.all(np.diag(S) == 0)
    np.testing.assert_allclose(S, A.T - A, rtol=0, atol=1e-12)


def test_influence_matrices_first_order_rows_give_zero_s():
    rng = np.random.default_rng(1)
    G = rng.normal(size=(5, 16))
    zeros = np.zeros_like(G)

    A, S = influence_matrices(G, zeros, zeros, 0.1)

    assert np.all(S == 0)
    np.testing.assert_allclose(A, -0.1 * G @ G.T, rtol=1e-12)


def test_influence_matrices_nonfinite_row_is_zero_row_and_column():
    G, Q, H = (m.copy() for m in _quadratic_rows())
    H[1, 0] = np.nan

    A, S = influence_matrices(G, Q, H, GAMMA)

    assert np.all(A[1] == 0) and np.all(A[:, 1] == 0)
    assert np.all(S[1] == 0) and np.all(S[:, 1] == 0)
    assert A[0, 2] == pytest.approx(A_BY_HAND[0, 2]) and S[2, 0] == pytest.approx(S_BY_HAND[2, 0])


def _parts() -> list[BatchSketches]:
    G, Q, H = _quadratic_rows()
    make = lambda rows, ids: BatchSketches(  # noqa: E731
        batch_ids=ids, G=G[rows], Q=Q[rows], H=H[rows], losses=np.zeros(len(rows)), estimator="hutchinson",
        step_size=GAMMA,
    )
    return [make([2, 0], [12, 10]), make([1], [11])]


def test_influence_from_sketches_two_parts_match_single_matrix_in_given_order():
    A, S, excluded = influence_from_sketches(_parts(), [10, 11, 12])

    np.testing.assert_allclose(A, A_BY_HAND, atol=1e-12)
    np.testing.assert_allclose(S, S_BY_HAND, atol=1e-12)
    assert excluded == []


def test_influence_from_sketches_reordered_ids_permute_s():
    _, S, _ = influence_from_sketches(_parts(), [12, 10, 11])

    perm = [2, 0, 1]
    np.testing.assert_allclose(S, S_BY_HAND[np.ix_(perm, perm)], atol=1e-12)


def test_influence_from_sketches_excluded_batch_is_reported_and_zeroed():
    parts = _parts()
    parts[1].excluded = [11]

    A, S, excluded = influence_from_sketches(parts, [10, 11, 12])

    assert excluded == [11]
    assert np.all(S[1] == 0) and np.all(S[:, 1] == 0)
    assert S[2, 0] == pytest.approx(0.25)


def test_influence_from_sketches_different_sketch_ids_raise():
    parts = _parts()
    parts[1].sketch_id = "other-reference"

    with pytest.raises(ValueError, match="different sketches"):
        influence_from_sketches(parts, [10, 11, 12])


def test_influence_from_sketches_missing_batch_raises():
    with pytest.raises(ValueError, match="without sketches"):
        influence_from_sketches(_parts(), [10, 11, 12, 13])


def test_influence_from_lookahead_row_blocks_assemble_a_and_s():
    A_full = np.arange(16, dtype=np.float64).reshape(4, 4)
    ids = [5, 6, 7, 8]
    parts = [
        LookaheadRows(batch_ids=ids, row_ids=[7, 5], A_rows=A_full[[2, 0]], losses=np.ones(4)),
        LookaheadRows(batch_ids=ids, row_ids=[6, 8], A_rows=A_full[[1, 3]], losses=np.ones(4), excluded=[8]),
    ]

    A, S, excluded = influence_from_lookahead(parts, ids)

    expected = A_full.copy()
    expected[3, :] = expected[:, 3] = 0
    np.testing.assert_array_equal(A, expected)
    np.testing.assert_array_equal(S, expected.T - expected)
    assert excluded == [8]


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"estimator": "newton"}, "estimator"),
        ({"preconditioner": "sgd"}, "preconditioner"),
        ({"gamma": 0.0}, "gamma"),
        ({"gamma": float("nan")}, "gamma"),
        ({"sample_fraction": 0.0}, "sample_fraction"),
        ({"sample_fraction": 1.5}, "sample_fraction"),
        ({"param_filter": "("}, "param_filter"),
        ({"dtype": "bfloat16"}, "dtype"),
        ({"device": "tpu"}, "device"),
    ],
)
def test_influence_config_bad_value_raises_naming_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        InfluenceConfig(**kwargs)


@pytest.mark.parametrize("kwargs, field", [({"k": 0}, "k"), ({"k": 8, "s": 9}, "s"), ({"seed": -1}, "seed")])
def test_sjlt_config_bad_value_raises_naming_field(kwargs, field):
    with pytest.raises(ValueError, match=f"sketch.{field}"):
        SjltSketchConfig(**kwargs)
