"""Ordering solvers for D3: S (K x K directional advantage) -> a training order of the K batches.

Importing this package registers the built-in solvers (row_sum, greedy_insertion, rsr, exact, ils)
on :class:`SolverConfig`. Ray is imported only inside :mod:`d3ray.solver.pool`'s functions, when a
pool is created, so importing this package stays cheap.
"""

from d3ray.solver.base import DEFAULT_SOLVER, Solver, SolverConfig, SolveResult, solve
from d3ray.solver.exact import ExactConfig, solve_exact
from d3ray.solver.greedy import GreedyInsertionConfig, RowSumConfig, greedy_insertion_order, row_sum_order
from d3ray.solver.ils import IlsConfig
from d3ray.solver.local_search import (
    Descent,
    RsrConfig,
    random_swap_refinement,
)
from d3ray.solver.pool import SolverPool, SolverPoolConfig, SolverWorker
from d3ray.solver.problem import (
    check_order,
    ordering_cost,
    swap_delta,
    validate_advantage,
)

__all__ = [
    "DEFAULT_SOLVER",
    "ExactConfig",
    "GreedyInsertionConfig",
    "IlsConfig",
    "Descent",
    "RowSumConfig",
    "RsrConfig",
    "SolveResult",
    "Solver",
    "SolverConfig",
    "SolverPool",
    "SolverPoolConfig",
    "SolverWorker",
    "check_order",
    "greedy_insertion_order",
    "ordering_cost",
    "random_swap_refinement",
    "row_sum_order",
    "solve",
    "solve_exact",
    "swap_delta",
    "validate_advantage",
]
