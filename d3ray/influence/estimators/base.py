"""The estimator family: how the influence of a chunk is estimated (registered, ``type: <name>``).

An estimator config is the registry entry (docs/design/conventions.md §2) and the estimator itself: estimators hold no
state beyond their knobs, so the config's methods are the pure functions of the estimator and nothing
needs building. Two kinds, told apart by :attr:`EstimatorConfig.is_exact_lookahead`:

- Taylor estimators (``first_order``, ``fisher``, ``gnb``, ``hutchinson``): per batch a loss, g and a
  Hessian-diagonal estimate h (:meth:`EstimatorConfig.statistics`), sketched per batch, so the
  batches of a chunk may be split across workers in any way; merged by
  :func:`~d3ray.influence.influence.influence_from_sketches`.
- The exact look-ahead (``lookahead``): real parameter steps and probe forwards; every worker needs all
  L batches (the columns) and the rows are split; merged by
  :func:`~d3ray.influence.influence.influence_from_lookahead`.

Callers ask the estimator (``is_exact_lookahead``, ``runs_on_shards``, :meth:`merge`) instead of comparing names.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from d3ray.registry import ChoiceConfig

if TYPE_CHECKING:
    import torch

    from d3ray.influence.statistics import BatchStatistics, CrossEntropyObjective, Params

__all__ = ["EstimatorConfig"]


class EstimatorConfig(ChoiceConfig):
    """An influence estimator, selected by ``type`` (a plain string ``estimator: fisher`` also works)."""

    is_exact_lookahead: ClassVar[bool] = False
    """True for the exact look-ahead: no sketches, rows split across workers, γ changes the order."""
    has_curvature: ClassVar[bool] = True
    """False when the estimator has no second-order term (then S ≡ 0 under the plain step)."""
    exact_potential: ClassVar[bool] = False
    """True when the AdamW drift potential f_i = ⟨g_i, w⟩ is computed exactly in full dimension and only
    the residual is sketched (potential.py; ``drift``)."""
    sketches_residual: ClassVar[bool] = True
    """False when nothing is sketched (``drift`` with ``residual: none``: the potential alone)."""
    batches_potential: ClassVar[bool] = False
    """True when an influence actor computes the potential alone for a whole call in batched
    forward-mode passes (``drift``, ``potential: jvp``; :func:`~d3ray.influence.chunk.potential_chunk`)."""
    needs_double_backward: ClassVar[bool] = False
    """True when the statistics differentiate a gradient again (Hessian-vector products): the influence
    model then runs eager attention (worker.py: ``influence_attention``)."""
    runs_on_shards: ClassVar[bool] = False
    """True when the trainer ranks can estimate it on their ZeRO-3 parameter slices (``schedule.placement:
    in_trainer``): one backward, linear over shards. d3ray/train/scheduling/sharded_influence.py says why the others
    cannot (a double backward, per-sequence gradients, one random stream over the whole batch, full steps)."""

    def statistics(
        self, objective: CrossEntropyObjective, params: Params, generator: torch.Generator
    ) -> BatchStatistics:
        """Loss, g and h of one batch (Taylor estimators).

        Args:
            objective: the batch's loss as a function of the parameters.
            params: name → leaf tensor with requires_grad (only the parameters that take part).
            generator: source of probes / sampled labels, on the parameters' device, seeded per batch.

        Returns:
            BatchStatistics; ``finite`` is False (and nothing raises) when the loss, g or h is not finite.
        """
        raise ValueError(f"the {self.type_name} estimator has no per-batch statistics")

    def merge(self, parts: Sequence[Any], order: Sequence[int]) -> tuple[np.ndarray, np.ndarray, list[int]]:
        """(A, S, excluded) of a chunk from the workers' parts, rows/columns in ``order``."""
        from d3ray.influence.influence import influence_from_sketches

        return influence_from_sketches(parts, order)

    def describe(self) -> str:
        """Name and knobs for logs and tables, e.g. ``hutchinson(probes=4)``."""
        knobs = ", ".join(f"{k}={v}" for k, v in vars(self).items())
        return f"{self.type_name}({knobs})" if knobs else self.type_name
