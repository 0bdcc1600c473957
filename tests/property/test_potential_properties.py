"""Hypothesis properties of a rank-2 potential S[i, j] = η·(f_j − f_i) (the AdamW drift potential of the
influence, d3ray/influence/potential.py eq. P3): the LOP is solved exactly by sorting f, every
registered solver's search finds that sort, and the solver layer's short-cut returns it without one."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from d3ray.influence.potential import potential_antisymmetric
from d3ray.solver import SolverConfig, ordering_cost
from d3ray.solver.ils import IlsConfig
from d3ray.solver.potential import potential_shortcut
from d3ray.solver.problem import validate_advantage

FAST = {"ils": {"max_iters": 50}, "rsr": {"max_iters": 500}}

potentials = st.lists(st.integers(-50, 50), min_size=2, max_size=12).map(lambda v: np.array(v) * 1e-3)


@settings(max_examples=40, deadline=None)
@given(f=potentials, eta=st.floats(1e-5, 1.0), name=st.sampled_from(SolverConfig.known()), data=st.data())
def test_solver_rank_two_potential_orders_by_ascending_f(f, eta, name, data) -> None:
    K = f.shape[0]
    if name == "exact" and K > 20:
        return
    S = potential_antisymmetric(f, eta)
    init = np.array(data.draw(st.permutations(range(K))), dtype=np.int64)
    solver = SolverConfig.lookup(name)(**FAST.get(name, {})).build()
    result = solver.solve(S, init=init, seed=data.draw(st.integers(0, 100)))
    searched, _ = solver._search(validate_advantage(S), init, ordering_cost(S, init), 0, float("inf"))

    if not np.any(np.diff(np.sort(f))):  # all equal: S ≡ 0, the initial order is kept
        assert result.flagged_zero and result.order.tolist() == init.tolist()
        return
    # ties aside, the order is the sort by f: f along it never decreases, and the cost is 0
    assert np.all(np.diff(f[result.order]) >= 0) and result.cost == 0.0
    assert np.all(np.diff(f[np.asarray(searched)]) >= 0)  # the search alone finds it too
    if name != "exact":  # the reference solver always runs its DP
        assert result.stats["shortcut"] == "potential" and result.stats["exact"] is True


@settings(max_examples=40, deadline=None)
@given(f=potentials, seed=st.integers(0, 2**32 - 1), scale=st.floats(0.0, 0.5))
def test_potential_shortcut_exact_only_when_the_sort_is_optimal(f, seed, scale) -> None:
    """With a residual: an exact short-cut always has cost 0 (optimal); with tol its ratio is within tol."""
    K = f.shape[0]
    R = np.random.default_rng(seed).normal(size=(K, K)) * scale * 1e-3
    S = validate_advantage(potential_antisymmetric(f) + (R - R.T))
    init = np.arange(K)
    exact = potential_shortcut(S, init, tol=0.0)
    loose = potential_shortcut(S, init, tol=0.25)

    if exact is not None:
        assert exact.exact and exact.cost == 0.0 == ordering_cost(S, exact.order)
    if loose is not None and not loose.exact:
        assert loose.residual_ratio <= 0.25 and loose.cost == ordering_cost(S, loose.order) > 0
        result = IlsConfig(max_iters=20, potential_tol=0.25).build().solve(S, init=init)
        assert result.stats["exact"] is False and result.stats["residual_ratio"] <= 0.25


@settings(max_examples=60, deadline=None)
@given(f=st.lists(st.integers(-50, 50), min_size=1, max_size=16).map(lambda v: np.array(v) * 1e-3),
       eta=st.floats(1e-4, 1.0), data=st.data())
def test_sort_by_potential_is_the_default_solvers_order_for_the_same_s(f, eta, data) -> None:
    """The coordinator's sort of f (no S) picks the order the default solver picked from S = η·(f_j − f_i)
    with the excluded batches' rows and columns zeroed, as d3ray/influence/influence.py merges it
    (issue 50.5: the default's order does not change)."""
    from d3ray.solver.loss_change import forward_weight, potential_forward_weight
    from d3ray.solver.potential import sort_by_potential

    K = f.shape[0]
    excluded = np.array(data.draw(st.lists(st.booleans(), min_size=K, max_size=K)))
    S = potential_antisymmetric(np.where(excluded, 0.0, f), eta)
    S[excluded, :] = 0.0
    S[:, excluded] = 0.0
    order, left_out = sort_by_potential(f, excluded, eta)
    assert left_out.tolist() == excluded.tolist()
    assert sorted(order.tolist()) == list(range(K))
    assert ordering_cost(S, order) == 0.0  # optimal for S, as the solver's order
    assert order.tolist() == IlsConfig().build().solve(S).order.tolist()  # ties, all-zero S included
    for perm in (order, np.arange(K), order[::-1]):
        assert potential_forward_weight(f, perm, eta, excluded) == pytest.approx(forward_weight(S, perm), abs=1e-9)
