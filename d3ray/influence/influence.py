"""Influence matrices A and S of a chunk from per-batch sketches (pure numpy, no Ray).

docs/design/method.md §5, with the step of batch i written Δθ_i = −η·u_i (η = γ and u = g for the
plain step; η = lr and u the AdamW direction with the ``adam`` preconditioner, README.md). With the
rows of G, U, Q, H (L x k) the sketches P g_i, P u_i, P(u_i ⊙ u_i), P h_i:

    A = −η · U Gᵀ + (η²/2) · Q Hᵀ                        A[i, j] ≈ I[i→j] = ℓ(B_j; θ + Δθ_i) − ℓ(B_j; θ)
    S = Aᵀ − A = −η · (G Uᵀ − U Gᵀ) + (η²/2) · (H Qᵀ − Q Hᵀ)   S[i, j] > 0: "train i before j"

For the plain step U = G: the first-order term is symmetric and cancels analytically (it is much
larger than S for small γ), S = (γ²/2)(H Qᵀ − Q Hᵀ); such sketches carry no U (``U is None``).
Either way S is antisymmetric to the last bit.

Bad batches do not lose the chunk: a batch whose loss, gradient or statistics are not finite is
*excluded*: its rows of G, Q, H are zeroed, so its row and column of A and S are zero (no preference;
the solver leaves it where the tie-break puts it), and it is counted and reported.

:class:`BatchSketches` is what a worker returns for its share of a chunk; :func:`influence_from_sketches`
merges the shares of several workers in the chunk's batch order. :class:`Reference` is the
full-dimension control-variate reference (see control_variate.py) that all workers of a chunk share.
Everything here is numpy only, so that the coordinator can merge without torch.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from d3ray.influence.potential import combine, potential_antisymmetric

logger = logging.getLogger(__name__)

__all__ = [
    "BatchSketches",
    "LookaheadRows",
    "Reference",
    "mean_reference",
    "influence_from_lookahead",
    "ChunkInfluence",
    "ChunkPotential",
    "chunk_potential",
    "influence_from_sketches",
    "influence_matrices",
    "nonfinite_rows",
]


@dataclass(frozen=True)
class Reference:
    """Full-dimension reference vectors, one per statistic, shared by all workers of a chunk.

    Attributes:
        vectors: statistic ("g", "q", "h") → parameter name → array shaped like the parameter. A
            statistic may be missing (then it gets no control variate).
        count: number of batches averaged into it (for merging partial means); informational.
    """

    vectors: Mapping[str, Mapping[str, np.ndarray]]
    count: int = 0

    @property
    def reference_id(self) -> str:
        """Content hash of the vectors: equal references have equal ids in every process."""
        digest = hashlib.blake2b(digest_size=12)
        for stat in sorted(self.vectors):
            for name in sorted(self.vectors[stat]):
                arr = np.ascontiguousarray(self.vectors[stat][name], dtype=np.float64)
                digest.update(f"{stat}/{name}/{arr.shape}".encode())
                digest.update(arr.tobytes())
        return digest.hexdigest()


def mean_reference(parts: Sequence[Reference]) -> Reference:
    """Count-weighted mean of partial references (e.g. the per-worker means of the previous chunk).

    Raises:
        ValueError: no part has a positive count, or the parts disagree on statistics / parameters.
    """
    parts = [p for p in parts if p.count > 0]
    if not parts:
        raise ValueError("mean_reference: no part holds any batch")
    total = sum(p.count for p in parts)
    keys = {stat: sorted(vecs) for stat, vecs in parts[0].vectors.items()}
    out: dict[str, dict[str, np.ndarray]] = {}
    for stat, names in keys.items():
        out[stat] = {}
        for name in names:
            try:
                acc = sum(np.asarray(p.vectors[stat][name], dtype=np.float64) * p.count for p in parts)
            except KeyError as err:
                raise ValueError(f"mean_reference: a part lacks {stat}/{err.args[0]}") from None
            out[stat][name] = (acc / total).astype(np.float32)
    return Reference(vectors=out, count=total)


@dataclass
class BatchSketches:
    """Sketches of n batches of a chunk, computed by one worker at one weights snapshot.

    Attributes:
        batch_ids: (n,) ids of the batches, in row order.
        G: (n, k') rows P g_i (k' = k, or k + 3 with the control variate); zero for excluded batches.
        Q: (n, k') rows P(u_i ⊙ u_i) (u = g for the plain step); None when H is (no curvature).
        H: (n, k') rows P h_i; None for ``first_order`` (no second-order term: nothing to ship).
        losses: (n,) ℓ(B_i; θ) on the sampled sequences (NaN/inf kept for excluded batches).
        excluded: ids of the batches whose loss or statistics were not finite.
        timings: seconds per phase, keys ``influence/<phase>_sec``.
        estimator: the estimator that made them (``EstimatorConfig.describe()``).
        step_size: η of the step Δθ_i = −η·u_i (γ, or the optimizer's learning rate).
        U: (n, k') rows P u_i of the step direction, or None when u = g (the plain step).
        sketch_id: identifies P and the control-variate reference; rows with different ids cannot be
            multiplied together and :func:`influence_from_sketches` refuses to merge them.
        means: full-dimension means of g, q, h over this share's finite batches (to build the next
            chunk's control-variate reference with :func:`~d3ray.influence.control_variate.mean_reference`);
            None unless asked for.
        potential: (n,) float64 f_i = ⟨g_i, w⟩, the exact AdamW drift potential (``drift`` estimator;
            potential.py), 0 for excluded batches; then U holds the residual rows P(u_i − w) (or has
            width 0 when the residual is not sketched). None for every other estimator.
    """

    batch_ids: list[int]
    G: np.ndarray
    Q: np.ndarray | None
    H: np.ndarray | None
    losses: np.ndarray
    excluded: list[int] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    estimator: str = ""
    step_size: float = 0.0
    U: np.ndarray | None = None
    sketch_id: str = ""
    means: Reference | None = None
    potential: np.ndarray | None = None


@dataclass(frozen=True)
class ChunkInfluence:
    """A whole chunk's S, merged where its sketches were made (the trainers, ``schedule.placement:
    in_trainer``): L² numbers leave the trainers instead of L · stats · k sketch rows.

    Attributes:
        batch_ids: the chunk's batch ids (row/column order of S).
        S: (L, L) float64, S = Aᵀ − A.
        excluded: batch ids with a non-finite loss or statistic (zero row and column).
        losses: (L,) the batches' losses on the sampled sequences.
        timings: seconds per phase (``influence/total_sec``).
    """

    batch_ids: list[int]
    S: np.ndarray
    excluded: list[int]
    losses: np.ndarray
    timings: dict[str, float] = field(default_factory=dict)


@dataclass
class ChunkPotential:
    """A whole chunk's drift potential f (the influence is the potential alone: S = η·(f_j − f_i),
    potential.py eq. P3), as the trainers send it (``schedule.placement: in_trainer``): L numbers, no S.

    Attributes:
        batch_ids: the chunk's batch ids (the order of ``potential``).
        potential: (L,) float64 f_i.
        excluded: batch ids with a non-finite loss or statistic (left out of the potential).
        losses: (L,) the batches' losses on the sampled sequences.
        step_size: η (the optimizer's learning rate), the scale of S.
        timings: seconds per phase (``influence/total_sec``).
    """

    batch_ids: list[int]
    potential: np.ndarray
    excluded: list[int]
    losses: np.ndarray
    step_size: float
    timings: dict[str, float] = field(default_factory=dict)


def chunk_potential(sketches: BatchSketches) -> ChunkPotential:
    """The :class:`ChunkPotential` of one part that holds a whole chunk's potential (zero-width rows)."""
    if sketches.potential is None:
        raise ValueError("chunk_potential: these sketches carry no potential")
    return ChunkPotential(batch_ids=list(sketches.batch_ids), potential=np.asarray(sketches.potential, np.float64),
                          excluded=[int(b) for b in sketches.excluded], losses=np.asarray(sketches.losses),
                          step_size=float(sketches.step_size), timings=dict(sketches.timings))


@dataclass
class LookaheadRows:
    """Rows of the exact look-ahead A (``lookahead`` estimator), computed by one worker.

    Attributes:
        batch_ids: (L,) ids of all batches of the chunk, the column order of ``A_rows``.
        row_ids: (R,) ids of the batches i whose rows were computed.
        A_rows: (R, L) A_rows[r, j] = I[row_ids[r] → batch_ids[j]]; NaN where not finite.
        losses: (L,) ℓ(B_j; θ).
        excluded: ids whose gradient (rows) or loss (all) was not finite.
        timings: seconds per phase.
    """

    batch_ids: list[int]
    row_ids: list[int]
    A_rows: np.ndarray
    losses: np.ndarray
    excluded: list[int] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)


def nonfinite_rows(*mats: np.ndarray) -> np.ndarray:
    """(L,) bool: rows with a NaN/inf entry in any of the (L, k) matrices."""
    bad = np.zeros(mats[0].shape[0], dtype=bool)
    for m in mats:
        bad |= ~np.isfinite(m).all(axis=1)
    return bad


def influence_matrices(
    G: np.ndarray, Q: np.ndarray, H: np.ndarray, step_size: float, U: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """A = −η·U Gᵀ + (η²/2)·Q Hᵀ and S = Aᵀ − A, in float64 (module docstring).

    Args:
        G, Q, H: (L, k) sketches P g_i, P(u_i ⊙ u_i), P h_i. Rows with a NaN/inf are treated as
            excluded batches (zero row and column in A and S).
        step_size: η > 0 (γ for the plain step).
        U: (L, k) sketches P u_i of the step directions; None for the plain step (u = g), where the
            first-order term is symmetric and left out of S.

    Returns:
        (A, S), both (L, L) float64; S exactly antisymmetric with a zero diagonal.
    """
    if not (G.shape == Q.shape == H.shape) or G.ndim != 2 or (U is not None and U.shape != G.shape):
        shapes = (G.shape, Q.shape, H.shape, None if U is None else U.shape)
        raise ValueError(f"G, Q, H (and U) must be (L, k) of one shape, got {shapes}")
    mats = (G, Q, H) if U is None else (G, Q, H, U)
    bad = nonfinite_rows(*mats)
    clean = [np.where(bad[:, None], 0.0, np.asarray(m, dtype=np.float64)) for m in mats]
    G, Q, H = clean[:3]
    M = Q @ H.T  # (L, L) M[i, j] ≈ u_iᵀ diag(h_j) u_i
    S = 0.5 * step_size**2 * (M.T - M)
    if U is None:
        F = G @ G.T  # (L, L)
        F = 0.5 * (F + F.T)  # exactly symmetric, whatever the BLAS summation order
    else:
        F = clean[3] @ G.T  # (L, L) F[i, j] ≈ ⟨u_i, g_j⟩
        S = S - step_size * (F.T - F)
    A = -step_size * F + 0.5 * step_size**2 * M
    if bad.any():
        logger.info("influence: %d of %d batches excluded (non-finite sketch rows)", int(bad.sum()), len(bad))
    return A, S


def influence_from_sketches(
    parts: Sequence[BatchSketches], order: Sequence[int]
) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Merge the sketches of several workers into the chunk's A and S.

    Args:
        parts: BatchSketches from the workers (any split of the chunk's batches).
        order: the chunk's batch ids; row/column t of A and S is batch order[t].

    Returns:
        (A, S, excluded): (L, L) float64 each, and the excluded batch ids in chunk order. With a
            ``potential`` (``drift``), S = η·(f_j − f_i) + the sketched residual (potential.py, eq. P3).

    Raises:
        ValueError: a batch id is missing or duplicated, or parts disagree on estimator, step size,
            width, step rows or sketch id (different P or control-variate reference).
    """
    if not parts:
        raise ValueError("influence_from_sketches: no parts")
    first = parts[0]

    def signature(p: BatchSketches) -> tuple:
        return p.sketch_id, p.estimator, p.G.shape[1], p.step_size, p.U is None, p.H is None, p.potential is None

    for p in parts[1:]:
        if signature(p) != signature(first):
            raise ValueError(
                "influence_from_sketches: parts were made with different sketches/references, estimators "
                f"or steps (sketch id, estimator, width, step size, plain step: {signature(first)} vs "
                f"{signature(p)})"
            )
    where: dict[int, tuple[int, int]] = {}
    for pi, p in enumerate(parts):
        for r, bid in enumerate(p.batch_ids):
            if bid in where:
                raise ValueError(f"influence_from_sketches: batch id {bid} appears in two parts")
            where[bid] = (pi, r)
    missing = [b for b in order if b not in where]
    if missing or len(set(order)) != len(order):
        raise ValueError(f"influence_from_sketches: order has ids without sketches or duplicates: {missing}")

    def stack(attr: str) -> np.ndarray:
        if getattr(first, attr) is None:  # Q, H of an estimator without curvature: zero
            return np.zeros((len(order), first.G.shape[1]))
        return np.stack([getattr(parts[where[b][0]], attr)[where[b][1]] for b in order]).astype(np.float64)

    G, Q, H = stack("G"), stack("Q"), stack("H")
    U = None if first.U is None else stack("U")
    flagged = {b for p in parts for b in p.excluded}
    bad = nonfinite_rows(*(m for m in (G, Q, H, U) if m is not None)) | np.array([b in flagged for b in order])
    for m in (G, Q, H, U):
        if m is not None:
            m[bad] = 0.0
    A, S = influence_matrices(G, Q, H, first.step_size, U)
    if first.potential is not None:  # the drift potential, exact (potential.py, eqs. P2-P3)
        f = np.array([parts[where[b][0]].potential[where[b][1]] for b in order], dtype=np.float64)
        bad |= ~np.isfinite(f)
        f[bad] = 0.0
        S = combine(potential_antisymmetric(f, first.step_size), S)
        S[bad, :] = 0.0
        S[:, bad] = 0.0
        A = A - first.step_size * f[None, :]  # A[i, j] gains −η·f_j
        A[bad, :] = 0.0
        A[:, bad] = 0.0
    return A, S, [b for b, is_bad in zip(order, bad, strict=True) if is_bad]


def influence_from_lookahead(
    parts: Sequence[LookaheadRows], order: Sequence[int]
) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Assemble the exact look-ahead A from row blocks and S = Aᵀ − A.

    Args:
        parts: LookaheadRows whose row_ids together cover ``order`` once.
        order: the chunk's batch ids (row/column order of A and S).

    Returns:
        (A, S, excluded) as in :func:`influence_from_sketches`; excluded batches (listed by the parts:
        bad gradient or bad loss) have zero rows and columns; any other non-finite entry becomes 0.
    """
    L = len(order)
    pos = {b: t for t, b in enumerate(order)}
    if len(pos) != L:
        raise ValueError("influence_from_lookahead: duplicate ids in order")
    A = np.full((L, L), np.nan)
    seen: set[int] = set()
    flagged: set[int] = set()
    for p in parts:
        cols = [pos[b] for b in p.batch_ids]
        for r, bid in enumerate(p.row_ids):
            if bid in seen:
                raise ValueError(f"influence_from_lookahead: row {bid} appears in two parts")
            seen.add(bid)
            A[pos[bid], cols] = p.A_rows[r]
        flagged.update(p.excluded)
    if seen != set(order):
        raise ValueError(f"influence_from_lookahead: rows missing for {sorted(set(order) - seen)}")
    bad = np.array([b in flagged for b in order])
    A[bad, :] = 0.0
    A[:, bad] = 0.0
    stray = ~np.isfinite(A)  # a single stepped loss that blew up: no preference for that pair
    if stray.any():
        logger.warning("influence_from_lookahead: %d non-finite entries of A set to 0", int(stray.sum()))
        A[stray] = 0.0
    return A, A.T - A, [b for b, is_bad in zip(order, bad, strict=True) if is_bad]
