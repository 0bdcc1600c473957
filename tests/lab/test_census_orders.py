"""The census's orders and statistics, on small cases worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from d3ray.lab.census.orders import (
    all_orders,
    alternate_order,
    census_orders,
    control_domain,
    distinct_orders,
    random_orders,
    recency_orders,
    reverse_order,
)
from d3ray.lab.census.stats import beats_median, pearson, rank_among, spearman, t_interval, z_score


def test_reverse_order_five_items_reads_backwards():
    assert reverse_order((3, 0, 4, 1, 2)) == (2, 1, 4, 0, 3)


def test_alternate_order_odd_and_even_lengths_interleave_the_two_ends():
    assert alternate_order((0, 1, 2, 3, 4)) == (0, 4, 1, 3, 2)
    assert alternate_order((7, 5, 3, 1)) == (7, 1, 5, 3)
    assert alternate_order((2,)) == (2,)


def test_random_orders_same_key_same_orders_and_longer_list_extends_it():
    first = random_orders(8, 4, seed=0, checkpoint=3, chunk_id=5)
    assert first == random_orders(8, 4, seed=0, checkpoint=3, chunk_id=5)
    assert random_orders(8, 6, seed=0, checkpoint=3, chunk_id=5)[:4] == first
    assert random_orders(8, 4, seed=0, checkpoint=3, chunk_id=6) != first
    assert all(sorted(o) == list(range(8)) for o in first)


def test_all_orders_three_items_six_permutations_and_large_l_refused():
    assert all_orders(3) == [(0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0)]
    with pytest.raises(ValueError, match="L=6"):
        all_orders(6)


def test_census_orders_names_and_shared_orders_grouped():
    named = census_orders(3, run=(0, 1, 2), d3=(2, 0, 1), lookahead=None, random=[(1, 0, 2)])
    assert named == {"stream": (0, 1, 2), "run": (0, 1, 2), "d3": (2, 0, 1), "d3_reverse": (1, 0, 2),
                     "d3_alternate": (2, 1, 0), "random_0": (1, 0, 2)}
    assert distinct_orders(named) == [((0, 1, 2), ["stream", "run"]), ((2, 0, 1), ["d3"]),
                                      ((1, 0, 2), ["d3_reverse", "random_0"]), ((2, 1, 0), ["d3_alternate"])]


def test_census_orders_not_a_permutation_raises_naming_it():
    with pytest.raises(ValueError, match="run"):
        census_orders(3, run=(0, 0, 2), d3=None, lookahead=None, random=[])


def test_z_score_and_rank_against_four_reference_losses():
    ref = [1.0, 2.0, 3.0, 4.0]  # mean 2.5, sample sd sqrt(5/3)
    assert z_score(1.5, ref) == pytest.approx(-1.0 / math.sqrt(5.0 / 3.0))
    assert rank_among(0.5, ref) == 1
    assert rank_among(2.5, ref) == 3
    assert rank_among(4.0, ref) == 4  # ties are not counted as better
    assert math.isnan(z_score(1.0, [2.0, 2.0]))
    assert beats_median(2.4, ref) and not beats_median(2.5, ref)


def test_t_interval_three_values_matches_hand_computed_interval():
    mean, lo, hi = t_interval([1.0, 2.0, 3.0])
    half = 4.302652729911275 * 1.0 / math.sqrt(3.0)  # t_{0.975, 2} · sd 1 / √3
    assert mean == 2.0
    assert lo == pytest.approx(2.0 - half) and hi == pytest.approx(2.0 + half)
    assert math.isnan(t_interval([1.0])[1])


def test_pearson_and_spearman_on_a_monotone_nonlinear_pair():
    x = [1.0, 2.0, 3.0, 4.0]
    y = [1.0, 4.0, 9.0, 16.0]
    # Pearson by hand: centred x (-1.5, -.5, .5, 1.5), y (-6.5, -3.5, 1.5, 8.5); Σxy = 25, Σx² = 5, Σy² = 129
    assert pearson(x, y) == pytest.approx(25.0 / math.sqrt(5.0 * 129.0))
    assert spearman(x, y) == pytest.approx(1.0)
    assert pearson([1.0, 2.0, float("nan"), 3.0], [2.0, 4.0, 0.0, 6.0]) == pytest.approx(1.0)
    assert math.isnan(pearson([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]))
    assert np.isnan(spearman([1.0, 2.0], [2.0, 1.0]))


def test_recency_orders_domain_heavy_batches_last_ties_in_stream_order():
    batches = [("a", "a", "b"), ("b", "b", "b"), ("a", "a", "a"), ("a", "b", "b")]  # counts of a: 2, 0, 3, 1
    assert recency_orders(batches, "a") == {"recency_last": (1, 3, 0, 2), "recency_first": (2, 0, 3, 1)}
    assert recency_orders([("a",), ("b",), ("b",)], "a")["recency_last"] == (1, 2, 0)


def test_control_domain_most_varying_count_or_given():
    batches = [("a", "b", "c"), ("a", "b", "b"), ("a", "c", "c")]  # spread: a 0, b 2, c 2 → b (alphabetical tie)
    assert control_domain(batches) == "b"
    assert control_domain(batches, "a") == "a"
