"""The drift potential of the AdamW step, exact: S = η·(f_j − f_i) + the residual (pure numpy).

Why: with the trainers' AdamW step (README.md, "Optimizer-aware influence") the directional advantage
S of a chunk is dominated by one rank-2 term, the potential of the common momentum/weight-decay drift.
That term needs one full-dimension dot product per batch, not a sketch; only what is left (the
residual) is worth sketching. Derivation (the notation of docs/design/method.md §7 and
:mod:`d3ray.influence.optimizer`; Loshchilov & Hutter 2019, Alg. 2, for the step):

The step batch i causes from the snapshot's state (θ, m, v, t), with its clipped gradient c_i·g_i,
c_i = min(1, C / (‖g_i‖ + 1e-6)), bias corrections b1 = 1 − β1^{t+1}, b2 = 1 − β2^{t+1}, is

    Δθ_i = −η·u_i,   u_i = λθ + (β1·m + (1−β1)·c_i g_i) ⊘ (b1·d_i),   d_i = √((β2·v + (1−β2)·c_i² g_i²) / b2) + ε.

Split u_i = w + s_i with the part that is the same for every batch of the chunk,

    w = λθ + β1·m ⊘ (b1·d₀),   d₀ = √(β2·v / b2) + ε          (eq. P1: the drift, built once per chunk)
    s_i = u_i − w = (1−β1)·c_i g_i ⊘ (b1·d_i) + β1·m ⊘ b1 ⊙ (1/d_i − 1/d₀)       (batch i's own part)

an identity (no approximation). The first-order influence A[i, j] = −η·⟨u_i, g_j⟩ (the Taylor form of
influence.py with no curvature term) is then

    A[i, j] = −η·f_j − η·⟨s_i, g_j⟩,   f_j = ⟨g_j, w⟩                                 (eq. P2)

and S = Aᵀ − A, S[i, j] = A[j, i] − A[i, j]:

    S[i, j] = η·(f_j − f_i)  +  η·(⟨s_i, g_j⟩ − ⟨s_j, g_i⟩)                             (eq. P3)
              └ potential ┘     └──────── residual ────────┘

- The potential is exact from L numbers f_i (one dot product of batch i's gradient with w, in full
  dimension; under ZeRO-3 a sum over ranks of the slices' dot products). It is rank 2 and
  antisymmetric, and it alone is ordered exactly by sorting: S_pot[i, j] > 0 iff f_i < f_j, so the
  ascending sort by f violates no pair (cost 0, the optimum; ties are free). Reading: −η·f_j is the
  loss change that the common drift gives batch j whichever batch is trained, so the batch the drift
  helps most gains most from coming later.
- The residual is first order too: with s_i ≈ c_i·D g_i, D = diag((1−β1)/(b1·d₀)), the part
  ⟨c_i D g_i, g_j⟩ is symmetric when c_i = c_j (D is diagonal) and cancels; what remains is the clip
  asymmetry (c_i − c_j)·⟨g_i, D g_j⟩ and batch i's own g_i² in d_i. A sketch of (s, g) carries it
  (the influence rows with U = P s in place of P u); the second-order term (η²/2)(⟨q_j, h_i⟩ − ⟨q_i, h_j⟩)
  would add to it unchanged.

So the sketch, which before carried w (the bulk of every u_i) through a JL map, now carries only s_i:
the potential has no sketch error at all. :func:`drift_potential`, :func:`potential_antisymmetric` and
:func:`combine` are eqs. P2-P3 on flat arrays (tests and references); the production path computes f
per batch on named tensors (``drift.py``) and merges here (``influence.influence_from_sketches``).
"""

from __future__ import annotations

import numpy as np

from d3ray.solver.potential import potential_difference

__all__ = ["combine", "drift_potential", "potential_antisymmetric"]


def drift_potential(grads: np.ndarray, w: np.ndarray) -> np.ndarray:
    """f_i = ⟨g_i, w⟩ for every batch (eq. P2), in float64.

    Args:
        grads: (L, d) gradients g_i of the chunk's batches, flattened.
        w: (d,) the drift of eq. P1 (the same vector for every batch).

    Returns:
        (L,) float64 potential f.

    Raises:
        ValueError: the shapes do not fit.
    """
    grads, w = np.asarray(grads, dtype=np.float64), np.asarray(w, dtype=np.float64)
    if grads.ndim != 2 or w.shape != (grads.shape[1],):
        raise ValueError(f"drift_potential: grads must be (L, d) and w (d,), got {grads.shape} and {w.shape}")
    return grads @ w  # (L,)


def potential_antisymmetric(f: np.ndarray, step_size: float = 1.0) -> np.ndarray:
    """The potential part of S (eq. P3): S_pot[i, j] = η·(f_j − f_i), exactly antisymmetric.

    Args:
        f: (L,) potential (:func:`drift_potential`); excluded batches carry 0.
        step_size: η > 0 (the optimizer's learning rate).

    Returns:
        (L, L) float64; S_pot[i, j] > 0 (train i before j) iff f_i < f_j.
    """
    f = np.asarray(f, dtype=np.float64)
    if f.ndim != 1:
        raise ValueError(f"potential_antisymmetric: f must be (L,), got {f.shape}")
    return potential_difference(f, step_size)


def combine(S_potential: np.ndarray, S_residual: np.ndarray) -> np.ndarray:
    """S = S_potential + S_residual (eq. P3), float64; exactly antisymmetric when both parts are.

    Raises:
        ValueError: the two parts differ in shape or are not square.
    """
    S_potential, S_residual = np.asarray(S_potential, np.float64), np.asarray(S_residual, np.float64)
    if S_potential.shape != S_residual.shape or S_potential.ndim != 2 or S_potential.shape[0] != S_potential.shape[1]:
        raise ValueError(f"combine: two (L, L) parts needed, got {S_potential.shape} and {S_residual.shape}")
    return S_potential + S_residual
