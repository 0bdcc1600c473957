"""The solver interface: the ``SolverConfig`` family, ``SolveResult`` and the shared solve contract.

Every solver (row_sum, greedy_insertion, rsr, exact, ils) is a ``SolverConfig`` registered by name
(``type: ils`` in YAML) whose ``build()`` returns an object with
``solve(S, init=None, seed=0) -> SolveResult``. The checks and guarantees common to all of them live
here, once, in :class:`SolverBase`:

- S is validated (square, finite, antisymmetric; :func:`~d3ray.solver.problem.validate_advantage`);
- ``init`` (default: the identity, i.e. the order the data arrived in) is checked to be a permutation;
- an all-zero S returns ``init`` unchanged with ``flagged_zero=True`` (the first-order estimator gives
  S ≡ 0: docs/design/method.md §6);
- the returned order is never worse than ``init``: a solver that cannot beat it returns it;
- an S whose sort by its fitted potential (:mod:`~d3ray.solver.potential`) has cost 0 is solved by that
  sort, without a search (certified optimal; ``stats["shortcut"] == "potential"``, ``exact`` True); with
  a config's ``potential_tol`` > 0 (ils) also when the residual is within it (``exact`` False); the
  exact solver, the reference that measures gaps, always runs its DP (and refuses K > 20);
- the result depends only on (S, init, seed, config), unless a wall-clock ``time_budget_s`` binds
  first (``stats["stopped_by"] == "time"``).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from d3ray.registry import ChoiceConfig
from d3ray.solver.potential import potential_shortcut
from d3ray.solver.problem import check_order, ordering_cost, validate_advantage

logger = logging.getLogger(__name__)

DEFAULT_SOLVER = "ils"

__all__ = ["DEFAULT_SOLVER", "SolveResult", "Solver", "SolverBase", "SolverConfig", "solve"]


@dataclass(frozen=True, eq=False)
class SolveResult:
    """What a solver returns for one S (compare fields, not results: ``eq`` is off for the array).

    Fields:
        order: (K,) int64 permutation, order[t] = item trained at step t.
        cost: objective of ``order`` (docs/design/method.md §8), recomputed from scratch.
        initial_cost: objective of the initial order (``init``, or the identity).
        seconds: wall time of the whole call, validation included.
        stats: solver-specific counters (``solver``, ``iters``, ``moves``, ``stopped_by``, ...).
        flagged_zero: S was all zero, so ``order`` is the initial order untouched.
    """

    order: np.ndarray
    cost: float
    initial_cost: float
    seconds: float
    stats: dict[str, Any] = field(default_factory=dict)
    flagged_zero: bool = False


class Solver(Protocol):
    """Anything that orders an advantage matrix."""

    def solve(self, S: np.ndarray, init: np.ndarray | None = None, seed: int = 0) -> SolveResult: ...


class SolverConfig(ChoiceConfig):
    """Root of the solver configs; concrete ones register with ``@SolverConfig.register(name)``."""

    def build(self) -> Solver:
        raise NotImplementedError(f"{type(self).__name__} does not implement build()")


def check_budget(name: str, time_budget_s: float | None, max_iters: int | None) -> None:
    """Validation shared by the configs that carry the common stopping fields."""
    if time_budget_s is not None and not time_budget_s > 0:
        raise ValueError(f"{name}.time_budget_s must be > 0 or None, got {time_budget_s!r}")
    if max_iters is not None and max_iters < 0:
        raise ValueError(f"{name}.max_iters must be >= 0 or None, got {max_iters!r}")


class SolverBase:
    """Shared ``solve`` contract; subclasses implement :meth:`_search`.

    ``self.config`` is the frozen config; subclasses that honour a wall-clock budget read
    ``config.time_budget_s`` (the deadline passed to ``_search`` already accounts for validation).
    """

    #: Try the potential short-cut before the search (the exact solver, a reference, always searches).
    shortcut_potential: bool = True

    def __init__(self, config: SolverConfig) -> None:
        self.config = config

    def solve(self, S: np.ndarray, init: np.ndarray | None = None, seed: int = 0) -> SolveResult:
        """Order the items of S.

        Args:
            S: (K, K) antisymmetric advantage, S[i, j] > 0 meaning "train i before j".
            init: (K,) initial permutation (the fallback order); default the identity.
            seed: seed of every random choice the solver makes.

        Returns:
            A :class:`SolveResult` with cost <= initial_cost.

        Raises:
            ValueError: S or init is malformed (see :func:`validate_advantage`).
        """
        t0 = time.perf_counter()
        budget = getattr(self.config, "time_budget_s", None)
        deadline = t0 + budget if budget is not None else float("inf")
        S = validate_advantage(S)
        K = S.shape[0]
        init_order = np.arange(K, dtype=np.int64) if init is None else check_order(init, K)
        initial_cost = ordering_cost(S, init_order)
        name = getattr(self.config, "type_name", type(self).__name__)
        if not S.any():
            logger.warning("all-zero advantage S (K=%d): keeping the initial order", K)
            stats = {"solver": name, "stopped_by": "zero"}
            return SolveResult(init_order, 0.0, 0.0, time.perf_counter() - t0, stats, flagged_zero=True)
        shortcut = (
            potential_shortcut(S, init_order, getattr(self.config, "potential_tol", 0.0))
            if self.shortcut_potential else None
        )
        if shortcut is not None:  # a (near) potential: the sort is the optimum, no search
            order = shortcut.order
            stats = {"shortcut": "potential", "exact": shortcut.exact, "residual_ratio": shortcut.residual_ratio}
            logger.info("%s: K=%d solved by the potential sort (%s, residual/potential %.3g)", name, K,
                        "certified optimal" if shortcut.exact else "within potential_tol", shortcut.residual_ratio)
        else:
            order, stats = self._search(S, init_order, initial_cost, int(seed), deadline)
        order = check_order(order, K)
        cost = ordering_cost(S, order)
        stats = {"solver": name, **stats}
        if cost > initial_cost:
            stats["kept_initial"] = True
            order, cost = init_order, initial_cost
        seconds = time.perf_counter() - t0
        logger.debug("%s: K=%d cost %.6g -> %.6g in %.3fs", name, K, initial_cost, cost, seconds)
        return SolveResult(order, cost, initial_cost, seconds, stats)

    def _search(
        self, S: np.ndarray, init: np.ndarray, init_cost: float, seed: int, deadline: float
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Return (order, stats) for a validated, non-zero S; ``deadline`` is a perf_counter time."""
        raise NotImplementedError


def solve(
    S: np.ndarray, config: SolverConfig | None = None, init: np.ndarray | None = None, seed: int = 0
) -> SolveResult:
    """Order S with ``config`` (default: the default solver, ``ils`` with its default settings).

    Builds the solver each call; hold ``config.build()`` yourself to reuse it.
    """
    if config is None:
        config = SolverConfig.lookup(DEFAULT_SOLVER)()
    return config.build().solve(S, init=init, seed=seed)


def override(config: SolverConfig, **changes: Any) -> SolverConfig:
    """``dataclasses.replace`` that ignores the keys the config does not have (e.g. ``time_budget_s``
    for ``row_sum``); the kept ones are validated by the config's ``__post_init__``."""
    names = {f.name for f in dataclasses.fields(config)}  # type: ignore[arg-type]
    return dataclasses.replace(config, **{k: v for k, v in changes.items() if k in names})  # type: ignore[type-var]
