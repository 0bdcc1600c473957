"""How close an estimated S comes to a reference S: what ``d3ray bench influence`` and its ``--snapshot-dtype``
section (``influence_snapshot.py``) report per chunk, and the median over chunks that skips missing values.
"""

from __future__ import annotations

import numpy as np


def _offdiag(S: np.ndarray) -> np.ndarray:
    return S[~np.eye(S.shape[0], dtype=bool)]


def fidelity(S_est: np.ndarray, S_ref: np.ndarray) -> tuple[float | None, float | None]:
    """(Spearman of off-diagonal entries, normalised regret of the exact order of S_est under S_ref)."""
    from scipy.stats import spearmanr

    from d3ray.solver.exact import solve_exact
    from d3ray.solver.problem import ordering_cost

    rho = None
    if np.ptp(_offdiag(S_est)) > 0 and np.ptp(_offdiag(S_ref)) > 0:
        rho = float(spearmanr(_offdiag(S_est), _offdiag(S_ref))[0])
    best = solve_exact(S_ref)[1]
    random_mean = 0.5 * float(np.maximum(S_ref, 0).sum())  # each pair violated with probability 1/2
    if random_mean - best <= 0:
        return rho, None
    # An all-zero S carries no preference: the order falls back to the initial one.
    order = np.arange(S_est.shape[0]) if not np.any(S_est) else solve_exact(S_est)[0]
    return rho, (ordering_cost(S_ref, order) - best) / (random_mean - best)


def median(values) -> float | None:
    """The median of the values that are not None; None when there are none."""
    values = [v for v in values if v is not None]
    return float(np.median(values)) if values else None
