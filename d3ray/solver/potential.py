"""The potential short-cut: an S that is (nearly) a potential is ordered exactly by one sort.

A rank-2 antisymmetric S[i, j] = p_j − p_i (the AdamW drift potential of D3's influence,
d3ray/influence/potential.py, eq. P3) is a transitive tournament: the ascending sort by p puts every
positive weight forward, cost 0, which is the LOP optimum (every cost is >= 0). Row-Sum finds it too
(row sum_i = Σp − K·p_i). For a general S, the least-squares potential is

    p̂ = argmin_p Σ_{i,j} (S[i, j] − (p_j − p_i))²  ⇒  p̂_i = −(1/K)·Σ_j S[i, j]   (centred; S antisymmetric)

(set the gradient in p_k to zero and use S[i, k] = −S[k, i]), and the residual R = S − (p̂_j − p̂_i)
is what could make the sort wrong. :func:`potential_shortcut` sorts by p̂ (ties kept in the initial
order) and accepts the sort when it is certified optimal (its cost under S is exactly 0: the residual
flips no pair) or, when a tolerance is given, when ‖R‖_F ≤ tol · ‖p̂_j − p̂_i‖_F (then the sort is the
potential's optimum, not necessarily S's: the result says which). O(K²) against the search's O(K² · iters).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from d3ray.solver.problem import ordering_cost

__all__ = ["PotentialShortcut", "fit_potential", "potential_difference", "potential_matrix", "potential_shortcut",
           "sort_by_potential"]


@dataclass(frozen=True, eq=False)
class PotentialShortcut:
    """The sort by the fitted potential, accepted for an S.

    Fields:
        order: (K,) int64, ascending p̂ (ties in the initial order's sequence).
        cost: its cost under S (0 when ``exact``).
        residual_ratio: ‖R‖_F / ‖p̂_j − p̂_i‖_F (inf when the potential is zero).
        exact: the sort is certified optimal for S (cost 0); False: accepted by the tolerance.
    """

    order: np.ndarray
    cost: float
    residual_ratio: float
    exact: bool


def fit_potential(S: np.ndarray) -> np.ndarray:
    """(K,) least-squares potential p̂_i = −mean_j S[i, j] of an antisymmetric S (module docstring)."""
    S = np.asarray(S, dtype=np.float64)
    return -S.sum(axis=1) / max(S.shape[0], 1)


def potential_shortcut(S: np.ndarray, init: np.ndarray, tol: float = 0.0) -> PotentialShortcut | None:
    """The sort by S's fitted potential when it is optimal (cost 0) or the residual is within ``tol``.

    Args:
        S: (K, K) antisymmetric float64 (as from :func:`~d3ray.solver.problem.validate_advantage`).
        init: (K,) the initial permutation; its sequence breaks ties of p̂.
        tol: accept a sort of non-zero cost when ‖R‖_F ≤ tol · ‖potential‖_F; 0 = only a certified optimum.

    Returns:
        The accepted :class:`PotentialShortcut`, or None (the search has to run).
    """
    if tol < 0:
        raise ValueError(f"potential tolerance must be >= 0, got {tol}")
    K = S.shape[0]
    p = fit_potential(S)
    position = np.empty(K, dtype=np.int64)
    position[np.asarray(init, dtype=np.int64)] = np.arange(K)
    order = np.lexsort((position, p)).astype(np.int64)  # by p, then by the initial position
    cost = ordering_cost(S, order)
    P = p[None, :] - p[:, None]  # (K, K) P[i, j] = p̂_j − p̂_i
    norm = float(np.linalg.norm(P))
    ratio = float(np.linalg.norm(S - P)) / norm if norm > 0 else float("inf")
    if cost == 0.0:
        return PotentialShortcut(order, 0.0, ratio, exact=True)
    if tol > 0 and ratio <= tol:
        return PotentialShortcut(order, cost, ratio, exact=False)
    return None


def sort_by_potential(f: np.ndarray, excluded: np.ndarray | None = None,
                      step_size: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """The order of a chunk whose S is the potential alone, S[i, j] = η·(f_j − f_i) (eq. P3 of
    d3ray/influence/potential.py): the ascending sort by f, ties in stream order. No solver runs.

    It is the order the solvers' short-cut (:func:`potential_shortcut`, identity ``init``) gives for that
    S: its fitted potential p̂_i = −(1/K)·Σ_j S[i, j] = η·(f_i − mean f) sorts as f. An excluded batch (a
    non-finite loss or statistic) has a zero row and column in S, so p̂ = 0 there: it sorts where
    f = the mean of the other batches' f. The key is that p̂, computed with the same floating-point
    operations as the short-cut on the merged S (an O(K²) sum, K = L numbers a row), so that batches tied
    in exact arithmetic (an excluded batch at the mean of the others, equal f) fall in the order the
    solver gave them, not in an order float rounding picks differently.

    Args:
        f: (K,) potential of the chunk's batches, in stream order (non-finite entries count as excluded).
        excluded: (K,) bool, batches to leave out of the potential; None = none but the non-finite ones.
        step_size: η > 0, the scale S was built with (it changes the rounding, not the order of distinct p̂).

    Returns:
        (order, excluded): the (K,) int64 permutation, and the (K,) bool batches left out of the
        potential (the given ones and the non-finite ones).
    """
    f = np.array(f, dtype=np.float64)
    if f.ndim != 1:
        raise ValueError(f"sort_by_potential: f must be (K,), got shape {f.shape}")
    bad = ~np.isfinite(f)
    if excluded is not None:
        bad |= np.asarray(excluded, dtype=bool)
    key = fit_potential(potential_matrix(f, bad, step_size))
    return np.lexsort((np.arange(f.shape[0]), key)).astype(np.int64), bad


def potential_matrix(f: np.ndarray, excluded: np.ndarray, step_size: float) -> np.ndarray:
    """S = η·(f_j − f_i) (eq. P3 of d3ray/influence/potential.py), zero in the rows and columns of the excluded
    and non-finite batches, built with the same operations as the influence merge builds it: the S the
    solvers were given for a potential, for :func:`sort_by_potential`'s key and where an S is asked for
    (``save_matrices``, the ``exact`` reference solver on a potential)."""
    f = np.asarray(f, dtype=np.float64)
    bad = np.asarray(excluded, dtype=bool) | ~np.isfinite(f)
    S = potential_difference(np.where(bad, 0.0, f), step_size)
    S[bad, :] = 0.0
    S[:, bad] = 0.0
    return S


def potential_difference(f: np.ndarray, step_size: float) -> np.ndarray:
    """η·(f_j − f_i) at [i, j] (eq. P3), float64, exactly antisymmetric: the one place the potential's S is
    computed (the influence merge's ``potential_antisymmetric`` and :func:`potential_matrix` both call it, so
    the sort's key and the S a solver is given agree bit for bit)."""
    f = np.asarray(f, dtype=np.float64)
    return step_size * (f[None, :] - f[:, None])  # diff.T == −diff bit for bit
