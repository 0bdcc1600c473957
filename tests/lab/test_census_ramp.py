"""The recency control's ramp layout: exact counts, every row once, the z ceiling it is built for, and the
census options and directory checks around it."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from d3ray.data.chunker import GlobalBatch
from d3ray.errors import UserError
from d3ray.lab.census.census import CensusOptions, check_inputs, check_out_dir, chunk_layout, load_run
from d3ray.lab.census.orders import recency_orders
from d3ray.lab.census.ramp import ramp_chunk, ramp_counts
from tests.lab.test_census_inputs import write_run


def test_ramp_counts_exact_small_cases():
    assert ramp_counts(20, 8, 16) == [0, 1, 1, 2, 3, 4, 4, 5]  # t = 0, .71, 1.43, ..., 5
    assert ramp_counts(120, 8, 16) == [14, 14, 15, 15, 15, 15, 16, 16]  # the half-range is B − n/L = 1
    assert ramp_counts(28, 8, 16) == [0, 1, 2, 3, 4, 5, 6, 7]  # an exact line
    assert ramp_counts(0, 8, 16) == [0] * 8 and ramp_counts(128, 8, 16) == [16] * 8
    assert ramp_counts(3, 1, 4) == [3]
    with pytest.raises(ValueError, match="0 <= n <= L·B"):
        ramp_counts(129, 8, 16)


@settings(max_examples=200, deadline=None)
@given(L=st.integers(1, 12), B=st.integers(1, 20), share=st.floats(0, 1))
def test_ramp_counts_sum_to_n_stay_in_range_and_never_fall(L, B, share):
    n = int(round(share * L * B))
    c = ramp_counts(n, L, B)
    assert sum(c) == n and all(0 <= x <= B for x in c)
    assert all(a <= b for a, b in itertools.pairwise(c))
    half = min(n / L, B - n / L)  # the steepest line through the mean inside [0, B]
    if L > 1:
        assert max(c) - min(c) > 2 * half - 2  # its span, to rounding


def _batch(domains: list[str], start: int, T: int = 4) -> GlobalBatch:
    B = len(domains)
    ids = np.arange(start * T, (start + B) * T, dtype=np.int32).reshape(B, T)
    return GlobalBatch(input_ids=ids, n_tokens=np.array([T - (i % 2) for i in range(B)], dtype=np.int32),
                       sample_ids=tuple(f"s{start + i}" for i in range(B)), domains=tuple(domains),
                       loss_mask=np.arange(B * T).reshape(B, T) % 3 > 0)


def test_ramp_chunk_redeals_every_row_once_with_its_tokens_and_masks():
    chunk = [_batch(["a", "x", "b", "x"], 0), _batch(["x", "b", "a", "a"], 4), _batch(["b", "a", "x", "b"], 8)]
    out = ramp_chunk(chunk, "x")
    assert [b.domains.count("x") for b in out] == ramp_counts(4, 3, 4) == [0, 1, 3]  # t = 0, 1.33, 2.67
    rows = {s: (b.input_ids[r].tolist(), int(b.n_tokens[r]), b.loss_mask[r].tolist(), b.domains[r])
            for b in chunk for r, s in enumerate(b.sample_ids)}
    moved = [(s, (b.input_ids[r].tolist(), int(b.n_tokens[r]), b.loss_mask[r].tolist(), b.domains[r]))
             for b in out for r, s in enumerate(b.sample_ids)]
    assert sorted(s for s, _ in moved) == sorted(rows) and all(rows[s] == v for s, v in moved)
    assert out[0].sample_ids == ("s0", "s2", "s5", "s6")  # the others in stream order, then x's
    # recency_last is the stream order of the ramp: the orders move x the most they can
    assert recency_orders([b.domains for b in out], "x")["recency_last"] == (0, 1, 2)
    with pytest.raises(ValueError, match="different numbers of rows"):
        ramp_chunk([_batch(["a", "x"], 0), _batch(["x"], 2)], "x")


def test_a_sort_of_the_ramp_reaches_the_z_ceiling_of_a_linear_position_effect():
    """The layout's purpose: with the loss linear in the domain's positions, recency_last's z against every
    order of the batches is √(L − 1)·corr(counts, ramp); the ramp gets closer to √(L − 1) than a stream's
    counts drawn by chance."""
    L = 6

    def z_of_last(counts):
        perms = list(itertools.permutations(range(L)))
        loss = {p: -sum(counts[b] * pos for pos, b in enumerate(p)) for p in perms}  # later = better
        values = np.array(list(loss.values()), dtype=float)
        last = recency_orders([["x"] * c + ["o"] * (8 - c) for c in counts], "x")["recency_last"]
        return (loss[last] - values.mean()) / values.std()

    ceiling = math.sqrt(L - 1)
    assert z_of_last(ramp_counts(15, L, 8)) == pytest.approx(-ceiling, rel=1e-12)  # (0, 1, 2, 3, 4, 5)
    chance = np.random.default_rng(0).multinomial(15, [1 / L] * L)
    assert abs(z_of_last(list(chance))) < abs(z_of_last(ramp_counts(15, L, 8)))


def test_ramp_options_need_the_recency_control_and_a_domain_and_keep_directories_apart(tmp_path):
    run = write_run(tmp_path / "rand", ["--schedule.type=random", "--schedule.L=4", "--train.steps=16",
                                        "--train.zero_stage=0"], [1, 2])
    info = load_run(run)
    for bad in (CensusOptions(run_dir=run, out=tmp_path / "o", control="recency", recency_layout="ramp"),
                CensusOptions(run_dir=run, out=tmp_path / "o", control="planted", control_domain="x",
                              recency_layout="ramp")):
        with pytest.raises(UserError, match="needs --control recency and --control-domain"):
            check_inputs(info, bad)
    with pytest.raises(UserError, match="--recency-layout spiral: one of stream, ramp"):
        check_inputs(info, CensusOptions(run_dir=run, out=tmp_path / "o", recency_layout="spiral"))
    ramp = CensusOptions(run_dir=run, out=tmp_path / "o", control="recency", control_domain="x",
                         recency_layout="ramp", checkpoints=[1], random_orders=2)
    assert check_inputs(info, ramp) == [1] and chunk_layout(ramp) == {"kind": "ramp", "domain": "x"}
    cdir = tmp_path / "o" / "branches" / "k00001" / "c00001"
    cdir.mkdir(parents=True)
    (cdir / "orders.json").write_text(json.dumps({"planted": None}))  # a census of the stream's batches
    check_out_dir(CensusOptions(run_dir=run, out=tmp_path / "o", control="recency"), L=4)
    with pytest.raises(UserError, match="with the stream's batches, and this census trains it with a ramp of x's"):
        check_out_dir(ramp, L=4)
    (cdir / "orders.json").write_text(json.dumps({"planted": None, "layout": chunk_layout(ramp)}))
    check_out_dir(ramp, L=4)
