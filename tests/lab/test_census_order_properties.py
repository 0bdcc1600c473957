"""The census's order transforms are permutations with the structure their names promise (Hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from d3ray.lab.census.orders import alternate_order, reverse_order

SETTINGS = settings(max_examples=60, deadline=None)


@SETTINGS
@given(st.integers(1, 30).flatmap(lambda n: st.permutations(list(range(n)))))
def test_alternate_and_reverse_any_permutation_stay_permutations_with_their_structure(order):
    alt = alternate_order(order)
    assert sorted(alt) == sorted(order)
    assert list(alt[0::2]) == list(order[: (len(order) + 1) // 2])  # the front half in order
    assert list(alt[1::2]) == list(reversed(order))[: len(order) // 2]  # the back half from the end
    assert reverse_order(reverse_order(order)) == tuple(order)
