"""The shared contract of every registered solver, and the behaviour of each on small instances."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from d3ray.config_loading import ConfigError, from_dict
from d3ray.solver import (
    GreedyInsertionConfig,
    IlsConfig,
    RowSumConfig,
    RsrConfig,
    SolverConfig,
    greedy_insertion_order,
    ordering_cost,
    row_sum_order,
    solve,
    solve_exact,
)
from tests.conftest import fresh_python

# Small budgets keep the heuristics fast; the contract does not depend on them.
FAST = {"ils": {"max_iters": 30}, "rsr": {"max_iters": 2000}}


def _config(name: str) -> SolverConfig:
    return SolverConfig.lookup(name)(**FAST.get(name, {}))


def _gaussian(K: int, seed: int) -> np.ndarray:
    A = np.random.default_rng(seed).normal(size=(K, K))
    return A - A.T


def _planted(K: int, noise: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    hidden = rng.permutation(K)
    rank = np.empty(K, dtype=int)
    rank[hidden] = np.arange(K)
    G = rng.normal(size=(K, K))
    S = np.sign(rank[None, :] - rank[:, None]) + noise * (G - G.T) / np.sqrt(2)
    return S, hidden


@pytest.mark.parametrize("name", SolverConfig.known())
def test_solver_contract_permutation_no_worse_than_init_not_better_than_exact(name: str) -> None:
    S = _gaussian(12, 0)
    init = np.random.default_rng(1).permutation(12)
    result = _config(name).build().solve(S, init=init, seed=3)
    assert result.order.dtype == np.int64
    assert sorted(result.order.tolist()) == list(range(12))
    assert result.cost == pytest.approx(ordering_cost(S, result.order), abs=1e-9)
    assert result.initial_cost == pytest.approx(ordering_cost(S, init), abs=1e-9)
    assert result.cost <= result.initial_cost + 1e-9
    assert result.cost >= solve_exact(S)[1] - 1e-9
    assert result.stats["solver"] == name
    assert not result.flagged_zero


@pytest.mark.parametrize("name", SolverConfig.known())
def test_solver_all_zero_s_returns_initial_order_flagged(name: str) -> None:
    init = np.array([2, 0, 3, 1])
    result = _config(name).build().solve(np.zeros((4, 4)), init=init)
    assert result.flagged_zero
    assert result.order.tolist() == init.tolist()
    assert result.cost == 0.0


@pytest.mark.parametrize("name", SolverConfig.known())
def test_solver_same_seed_same_order(name: str) -> None:
    S = _gaussian(15, 4)
    solver = _config(name).build()
    first, second = solver.solve(S, seed=11), solver.solve(S, seed=11)
    assert first.order.tolist() == second.order.tolist()


@pytest.mark.parametrize("name", SolverConfig.known())
def test_solver_non_antisymmetric_s_raises(name: str) -> None:
    with pytest.raises(ValueError, match="antisymmetric"):
        _config(name).build().solve(np.ones((3, 3)))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ils_planted_order_small_noise_recovered(seed: int) -> None:
    S, hidden = _planted(40, noise=0.3, seed=seed)
    result = solve(S, seed=seed)
    assert result.order.tolist() == hidden.tolist()


def test_ils_k16_reaches_exact_optimum() -> None:
    S = _gaussian(16, 6)
    assert solve(S).cost == pytest.approx(solve_exact(S)[1], abs=1e-9)


def test_ils_beats_rsr_on_gaussian_k60() -> None:
    S = _gaussian(60, 7)
    assert solve(S).cost < solve(S, RsrConfig()).cost


def test_ils_time_budget_alone_stops_an_unbounded_search_with_a_valid_order() -> None:
    # No iteration or patience limit: only the clock can stop it, however fast or loaded the box.
    result = solve(_gaussian(200, 8), IlsConfig(max_iters=None, patience=None, time_budget_s=0.05))
    assert result.stats["stopped_by"] == "time"
    assert sorted(result.order.tolist()) == list(range(200))
    assert result.cost == pytest.approx(ordering_cost(_gaussian(200, 8), result.order), abs=1e-9)
    assert result.cost <= result.initial_cost


def test_row_sum_order_rank_two_structure_is_optimal() -> None:
    a = np.array([0.3, -1.0, 2.0, 0.7])  # S[i, j] = a_i - a_j: i first when a_i is larger
    S = a[:, None] - a[None, :]
    order = row_sum_order(S)
    assert order.tolist() == [2, 3, 0, 1]
    assert ordering_cost(S, order) == 0.0


def test_greedy_insertion_three_cycle_breaks_lightest_edge() -> None:
    # 0 -> 1 (2), 1 -> 2 (3), 2 -> 0 (1): the optimum violates only the weight-1 edge.
    S = np.array([[0.0, 2.0, -1.0], [-2.0, 0.0, 3.0], [1.0, -3.0, 0.0]])
    order = greedy_insertion_order(S, np.arange(3))
    assert ordering_cost(S, order) == 1.0


def test_greedy_insertion_row_sum_sequence_ignores_the_initial_order() -> None:
    # The row-sum sequence depends on S alone (no ties in a Gaussian S); the initial sequence is the init.
    S = _gaussian(30, 9)
    inits = [np.random.default_rng(s).permutation(30) for s in (1, 2)]
    by_rows = [solve(S, GreedyInsertionConfig(sequence="row_sum"), init=i).order.tolist() for i in inits]
    assert by_rows[0] == by_rows[1] == greedy_insertion_order(S, row_sum_order(S)).tolist()
    by_init = solve(S, GreedyInsertionConfig(sequence="initial"), init=inits[0]).order
    assert by_init.tolist() == greedy_insertion_order(S, inits[0]).tolist()


def test_rsr_starts_from_row_sum_and_improves_it() -> None:
    S = _gaussian(30, 10)
    result = solve(S, RsrConfig(max_iters=3000))
    assert result.stats["start_cost"] == pytest.approx(solve(S, RowSumConfig()).cost)
    assert result.cost < result.stats["start_cost"]


def test_solver_config_from_dict_by_type_name() -> None:
    config = from_dict(SolverConfig, {"type": "ils", "max_iters": 5, "time_budget_s": 0.5})
    assert isinstance(config, IlsConfig)
    assert (config.max_iters, config.time_budget_s) == (5, 0.5)


def test_solver_config_bad_value_names_field() -> None:
    with pytest.raises(ValueError, match="ils.time_budget_s"):
        IlsConfig(time_budget_s=0.0)
    with pytest.raises(ConfigError, match="unknown key"):
        from_dict(SolverConfig, {"type": "rsr", "restarts": 3})


def test_solver_package_import_does_not_import_ray() -> None:
    code = "import sys, d3ray.solver, d3ray.solver.pool, d3ray.solver.command; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_reading_a_run_config_does_not_import_numba_and_the_first_search_does() -> None:
    """Every process that reads a run config (trainers, coordinator, actors) imports the solver configs; the
    compiled kernels (numba, ~0.4-0.8 s to import) come with the first search, which still finds the optimum."""
    seen = fresh_python(
        "import json, sys\n"
        "import numpy as np\n"
        "import d3ray.config, d3ray.train.loop, d3ray.solver\n"
        "before = 'numba' in sys.modules\n"
        "from d3ray.solver import IlsConfig, RsrConfig, solve\n"
        "a = np.array([0.3, -1.0, 2.0, 0.7]); S = a[:, None] - a[None, :]\n"
        "orders = [solve(S, c, init=np.array([1, 0, 3, 2])).order.tolist() for c in (IlsConfig(), RsrConfig())]\n"
        "print(json.dumps({'before': before, 'after': 'numba' in sys.modules, 'orders': orders}))\n")
    assert seen == {"before": False, "after": True, "orders": [[2, 3, 0, 1], [2, 3, 0, 1]]}
