"""Control variate: exact algebra, unbiasedness, and the noise reduction it exists for."""

from __future__ import annotations

import numpy as np
import torch

from d3ray.influence.control_variate import ControlVariate, Reference, mean_reference
from d3ray.influence.influence import influence_matrices
from d3ray.influence.sketch import IdentitySketch, SparseJLSketch


def _stats(rng: np.random.Generator, n: int = 5, d: int = 400, spread: float = 0.2):
    """Batch statistics like real ones: q = g ⊙ g ≥ 0 sharing a large common part, h noisy around a mean."""
    g = 1.0 + spread * rng.normal(size=(n, d))
    h = 0.5 + rng.normal(size=(n, d))
    return {
        "g": {"w": torch.tensor(g[:, :300].reshape(n, 30, 10)), "b": torch.tensor(g[:, 300:])},
        "q": {"w": torch.tensor((g**2)[:, :300].reshape(n, 30, 10)), "b": torch.tensor((g**2)[:, 300:])},
        "h": {"w": torch.tensor(h[:, :300].reshape(n, 30, 10)), "b": torch.tensor(h[:, 300:])},
    }


def _flat(named: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(t.shape[0], -1) for t in named.values()], dim=1)


def _reference(stats) -> Reference:
    return Reference(
        vectors={s: {n: t.mean(0).numpy() for n, t in v.items()} for s, v in stats.items()}, count=5
    )


def _rows(stats, sketch, reference: Reference | None):
    plain = {s: sketch.project(v) for s, v in stats.items()}
    if reference is None:
        return plain
    return ControlVariate(reference, sketch, torch.device("cpu"), torch.float64).augment(stats, plain)


def test_control_variate_identity_sketch_keeps_every_inner_product():
    rng = np.random.default_rng(0)
    stats = _stats(rng)
    reference = _reference(_stats(np.random.default_rng(1)))

    rows = _rows(stats, IdentitySketch(), reference)

    torch.testing.assert_close(
        rows["q"] @ rows["h"].T, _flat(stats["q"]) @ _flat(stats["h"]).T, rtol=1e-12, atol=1e-9
    )
    torch.testing.assert_close(
        rows["g"] @ rows["g"].T, _flat(stats["g"]) @ _flat(stats["g"]).T, rtol=1e-12, atol=1e-9
    )


def test_control_variate_inner_product_unbiased_over_seeds():
    stats = _stats(np.random.default_rng(2), n=2)
    reference = _reference(_stats(np.random.default_rng(3)))
    exact = float(_flat(stats["q"])[0] @ _flat(stats["h"])[1])
    seeds = 200

    est = np.array(
        [
            float((lambda r: r["q"][0] @ r["h"][1])(_rows(stats, SparseJLSketch(16, 2, s), reference)))
            for s in range(seeds)
        ]
    )

    assert abs(est.mean() - exact) <= 4 * est.std(ddof=1) / np.sqrt(seeds)


def test_control_variate_lowers_sketch_noise_of_s_at_least_twofold():
    stats = _stats(np.random.default_rng(4))
    reference = _reference(_stats(np.random.default_rng(5)))  # another chunk's mean, as in the pipeline
    S_exact = influence_matrices(*(r.numpy() for r in _rows(stats, IdentitySketch(), None).values()), 1.0)[1]
    err = {True: [], False: []}
    for seed in range(40):
        sketch = SparseJLSketch(64, 4, seed)
        for cv in (True, False):
            rows = _rows(stats, sketch, reference if cv else None)
            S = influence_matrices(*(r.numpy() for r in rows.values()), 1.0)[1]
            err[cv].append(np.sqrt(np.mean((S - S_exact) ** 2)))

    # The common part of q dominates the plain sketch's error; removing it (‖q⊥‖/‖q‖ ≈ 0.4 here,
    # 0.45-0.7 on the tiny GPT-2) cut the RMS error of S 2.3x (deterministic seeds).
    assert np.mean(err[True]) * 2 < np.mean(err[False])


def test_control_variate_zero_reference_is_plain_sketch_plus_zero_columns():
    stats = _stats(np.random.default_rng(6))
    zero = Reference(vectors={s: {n: np.zeros(t.shape[1:]) for n, t in v.items()} for s, v in stats.items()})
    sketch = SparseJLSketch(32, 2, 0)

    rows = _rows(stats, sketch, zero)
    plain = _rows(stats, sketch, None)

    for s in ("g", "q", "h"):
        torch.testing.assert_close(rows[s][:, :32], plain[s], rtol=0, atol=0)
        assert torch.all(rows[s][:, 32:] == 0)


def test_mean_reference_weights_parts_by_count_and_ids_follow_content():
    a = Reference(vectors={"q": {"w": np.array([1.0, 2.0])}}, count=1)
    b = Reference(vectors={"q": {"w": np.array([4.0, 5.0])}}, count=2)

    merged = mean_reference([a, b])

    np.testing.assert_allclose(merged.vectors["q"]["w"], [3.0, 4.0])
    assert merged.count == 3
    assert merged.reference_id == Reference(vectors={"q": {"w": np.array([3.0, 4.0])}}).reference_id
    assert merged.reference_id != a.reference_id
