"""Control variate for sketched inner products: exact terms along reference directions, sketch the rest.

Why: S[i, j] = (γ²/2)(⟨q_j, h_i⟩ − ⟨q_i, h_j⟩) with q = g ⊙ g ≥ 0 is a small difference of two inner
products of vectors that share a large common part (every q_i is close to the mean q̄). The error of a
JL estimate ⟨Pu, Pv⟩ scales with ‖u‖·‖v‖/√k, so most of the sketch noise in S comes from that common
part. Decompose each vector along a unit reference direction r̂ (e.g. the previous chunk's mean, kept in
full dimension), u = a·r̂ + u⊥ with a = ⟨u, r̂⟩; then

    ⟨q_i, h_j⟩ = a_i b_j c + a_i ⟨r̂_q, h⊥_j⟩ + b_j ⟨q⊥_i, r̂_h⟩ + ⟨q⊥_i, h⊥_j⟩,   c = ⟨r̂_q, r̂_h⟩,

where the first three terms are exact (full-dimension dot products, computed per batch) and only the
residual term is sketched, with variance ‖q⊥‖²‖h⊥‖²/k instead of ‖q‖²‖h‖²/k. The estimate stays
unbiased for any fixed reference. The exact terms are written as three extra coordinates, so that the
augmented rows keep the form A = −γ·G Gᵀ + (γ²/2)·Q Hᵀ (and merge like plain sketches):

    Q'_i = [P q_i − a_i P r̂_q,  a_i,  a_i,  ⟨q_i, r̂_h⟩ − a_i c]
    H'_j = [P h_j − b_j P r̂_h,  c b_j,  ⟨h_j, r̂_q⟩ − b_j c,  b_j]
    G'_i = [P g_i − α_i P r̂_g,  α_i,  0,  0]        (α_i = ⟨g_i, r̂_g⟩, a projection: G'G'ᵀ stays a Gram)

With a preconditioned step (u ≠ g, README.md) the first-order term ⟨u_i, g_j⟩ is a product of two
different statistics: the pair (u, g) then gets the (q, h) form above, U' on the left, G' on the right.

Linearity is kept (P q⊥ = P q − a·P r̂), so shards may sketch and dot their slices and sum. Every worker
of a chunk must use the same reference, or the rows cannot be multiplied together: the reference
carries a content hash (``reference_id``) that the merge checks.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np
import torch

from d3ray.influence.influence import Reference, mean_reference
from d3ray.influence.shards import Shards, reduce_sum
from d3ray.influence.sketch import Sketch

logger = logging.getLogger(__name__)

# Reference and mean_reference live in influence.py (numpy only) and are re-exported here.
__all__ = ["EXTRA_COLUMNS", "ControlVariate", "Reference", "mean_reference"]
#: Columns appended to every sketch row by the control variate.
EXTRA_COLUMNS = 3


class ControlVariate:
    """Applies one reference to batches' sketches; see the module docstring for the algebra.

    Args:
        reference: the shared reference (numpy, full dimension; with ``shards``, this rank's slices).
        sketch: the run's sketch P.
        device, dtype: where the statistics live.
        shards: sharded influence (shards.py): the vectors are this rank's slices, and every norm,
            projection and dot product is summed over ranks before it is used (each a collective:
            every rank builds and augments in the same order).
    """

    def __init__(
        self, reference: Reference, sketch: Sketch, device: torch.device, dtype: torch.dtype,
        shards: Shards | None = None,
    ) -> None:
        self.reference_id = reference.reference_id
        self.shards, self.device, self.dtype = shards, device, dtype
        offsets = None if shards is None else shards.offsets
        self.unit: dict[str, dict[str, torch.Tensor]] = {}
        self.sketched: dict[str, torch.Tensor] = {}  # stat → (k,) P r̂
        for stat in sorted(reference.vectors):  # sorted: the same collective order on every rank
            vecs = reference.vectors[stat]
            tensors = {n: torch.as_tensor(v if torch.is_tensor(v) else np.asarray(v), device=device).to(dtype)
                       for n, v in vecs.items()}
            # Started from a zero on ``device``: a rank with no slices still reduces a tensor where the group does.
            squares = sum(((t.double() ** 2).sum() for t in tensors.values()),
                          torch.zeros((), dtype=torch.float64, device=device))
            norm = torch.sqrt(reduce_sum(shards, squares))
            if not torch.isfinite(norm) or norm == 0:
                continue  # no usable direction: this statistic is sketched plainly
            self.unit[stat] = {n: (t / norm.to(dtype)) for n, t in tensors.items()}
            projected = sketch.project({n: t.unsqueeze(0) for n, t in self.unit[stat].items()}, offsets)[0]
            self.sketched[stat] = reduce_sum(shards, projected)

    def _dot(
        self, u: Mapping[str, torch.Tensor] | None, v: Mapping[str, torch.Tensor] | None
    ) -> torch.Tensor | float:
        """⟨u, v⟩ over the parameters both hold; u may carry a leading batch dim (n, *shape) → (n,).

        Whether u or v is None is the same on every rank (the reference directions are global)."""
        if u is None or v is None:
            return 0.0
        total = torch.zeros((), dtype=self.dtype, device=self.device)  # on the statistics' device, never a CPU scalar
        for name, vt in v.items():
            ut = u[name]
            total = total + ut.reshape(*ut.shape[: ut.dim() - vt.dim()], -1) @ vt.reshape(-1)  # no (n, *shape) product
        return reduce_sum(self.shards, total)

    def augment(
        self,
        stats: Mapping[str, Mapping[str, torch.Tensor]],
        sketches: Mapping[str, torch.Tensor],
    ) -> dict[str, torch.Tensor]:
        """Rows with the reference terms made exact.

        Args:
            stats: statistic → name → (n, *shape) full-dimension vectors of n batches: g, q, h, and u
                (the step direction) when it differs from g.
            sketches: statistic → (n, k) plain sketches P g, P q, P h (P u) of the same vectors.

        Returns:
            statistic → (n, k + EXTRA_COLUMNS) rows G', Q', H' (U') of the module docstring, for the
            statistics in ``sketches`` ("q" and "h" only together).
        """
        n = next(iter(sketches.values())).shape[0]
        ref = next(iter(sketches.values()))
        zero = torch.zeros(n, dtype=ref.dtype, device=ref.device)
        out = {}
        as_col = lambda x: (x if torch.is_tensor(x) else zero + x)[:, None]  # noqa: E731
        if "u" in sketches:
            out["u"], out["g"] = self._pair(stats, sketches, "u", "g", zero, as_col)
        elif "g" in sketches:
            alpha, g_res = self._along(stats, sketches, "g", zero)
            out["g"] = torch.cat([g_res, as_col(alpha), as_col(zero), as_col(zero)], dim=1)
        if "q" in sketches and "h" in sketches:
            out["q"], out["h"] = self._pair(stats, sketches, "q", "h", zero, as_col)
        return out

    def _along(
        self, stats: Mapping[str, Mapping[str, torch.Tensor]], sketches: Mapping[str, torch.Tensor], stat: str,
        zero: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(coefficient a (n,), residual sketch (n, k)) of stat along its own reference direction."""
        if stat not in self.unit:
            return zero, sketches[stat]
        a = self._dot(stats[stat], self.unit[stat])
        return a, sketches[stat] - a[:, None] * self.sketched[stat][None, :]

    def _pair(self, stats, sketches, left: str, right: str, zero, as_col) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows (L'_i, R'_j) with ⟨L'_i, R'_j⟩ ≈ ⟨left_i, right_j⟩, the reference parts exact."""
        a, l_res = self._along(stats, sketches, left, zero)
        b, r_res = self._along(stats, sketches, right, zero)
        c = self._dot(self.unit.get(left), self.unit.get(right))  # ⟨r̂_left, r̂_right⟩
        l_cross = self._dot(stats[left], self.unit.get(right)) - a * c  # ⟨left⊥_i, r̂_right⟩
        r_cross = self._dot(stats[right], self.unit.get(left)) - b * c  # ⟨r̂_left, right⊥_j⟩
        rows_left = torch.cat([l_res, as_col(a), as_col(a), as_col(l_cross)], dim=1)
        rows_right = torch.cat([r_res, as_col(b * c), as_col(r_cross), as_col(b)], dim=1)
        return rows_left, rows_right
