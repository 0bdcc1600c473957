"""``drift``: the AdamW drift potential exact in full dimension, plus an optional sketched residual.

With the AdamW step, S = η·(f_j − f_i) + η·(⟨s_i, g_j⟩ − ⟨s_j, g_i⟩) (potential.py, eq. P3): f_i = ⟨g_i, w⟩
with w the momentum/weight-decay drift, the same for every batch of the chunk. This estimator computes
f_i exactly (one full-dimension dot product per batch, w built once per chunk from the snapshot's
AdamW state) and sketches only the residual pair (s, g) (``residual: sketch``), or drops it
(``residual: none``, the default: no sketch, no AdamW direction, the gradient and one dot product per
batch).
The statistics are first_order's (the gradient only). With the plain step (preconditioner ``none``)
there is no drift: f ≡ 0 and S ≡ 0, as for first_order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from d3ray.influence.estimators.base import EstimatorConfig

if TYPE_CHECKING:
    import torch

    from d3ray.influence.statistics import BatchStatistics, CrossEntropyObjective, Params

__all__ = ["POTENTIALS", "RESIDUALS", "DriftConfig"]

#: ``sketch``: the residual (s, g) through the run's sketch (+ control variate); ``none``: potential only.
RESIDUALS = ("sketch", "none")
#: how f_i is computed: ``jvp`` (forward-mode AD) or ``step`` (the drift step's loss change), many batches
#: per pass, or ``gradient`` (⟨g_i, w⟩, one forward + backward per batch).
POTENTIALS = ("jvp", "step", "gradient")


@EstimatorConfig.register("drift")
@dataclass(frozen=True, kw_only=True)
class DriftConfig(EstimatorConfig):
    """Exact drift potential + sketched residual (1 backward + 1 dot product per batch)."""

    has_curvature: ClassVar[bool] = False
    exact_potential: ClassVar[bool] = True
    runs_on_shards: ClassVar[bool] = True  # f_i: a sum over ranks of the slices' dot products with the elementwise w

    residual: str = "none"
    """``none`` (default): the potential alone (no sketch, no AdamW direction: the cheapest; the order is
    the sort by f). ``sketch``: S = exact potential + the sketched residual ⟨s_i, g_j⟩ − ⟨s_j, g_i⟩ (all
    of the first-order S, the potential without sketch error). ``d3ray bench influence`` on gpt2-small
    @1000 (docs/results/influence-fidelity-cost-2026-12-01-to-03.md): the sketched residual adds more sketch noise than
    signal at k = 16,384 (median regret 0.06 against the look-ahead, as first_order) while the potential
    alone orders better (0.02) at 0.21x a training step instead of 0.80x."""

    potential: str = "step"
    """How an influence actor computes f_i with ``residual: none``: ``step`` (default; two batched forwards),
    ``jvp`` (batched forward-mode AD) or ``gradient`` (a forward + backward per batch).

    The first two run the sampled sequences of the whole call in batched passes (drift.py,
    ``batched_potentials``). ``step`` (default): f_i = (ℓ_i(θ) − ℓ_i(θ − η·w)) / η, the loss change of the drift step itself
    (two plain forwards, no derivative; float32 differences of two losses, which lose digits only where
    η·|f| nears the loss's rounding, i.e. as the learning rate goes to 0, where S = η·(f_j − f_i) itself
    vanishes; at η = 0 it takes ``jvp``); ``jvp``: f_i = d/dε ℓ_i(θ + ε·w) by forward-mode AD, no
    gradient; ``gradient``: one forward + backward per batch and the dot product ⟨g_i, w⟩. jvp and
    gradient give the same f to rounding; step differs from them by the curvature along w (O(η)).
    ``d3ray bench influence`` (docs/results/influence-fidelity-cost-2026-12-01-to-03.md): the same orders on tiny
    and small @1000 (10 chunks each), at 0.25x / 0.09x a training step per scored batch against 0.54x /
    0.18x for ``gradient``. The sketched residual and in-trainer scoring (ZeRO-3 slices) need g_i and
    always take ``gradient``."""

    tokens_per_pass: int = 512
    """Tokens stacked into one pass (``potential: jvp | step``; whole sequences, one at least): bounds its
    memory, about 2 x tokens x vocabulary floats of logits (and their tangents for jvp), and its speed on a
    CPU, where a pass whose logits outgrow the caches costs more per token: 16 sequences of 128 tokens,
    no-grad forward and loss on one thread, 512 tokens a pass within 4% of the fastest at vocabulary 4,096
    and 8,192 and for gpt2-small, 4,096 tokens 46-80% slower (the row sums bit for bit the same;
    docs/results/bench-pipeline-default-d3-2026-12-06.md). Was 4,096."""

    def __post_init__(self) -> None:
        if self.residual not in RESIDUALS:
            raise ValueError(f"drift.residual must be one of {list(RESIDUALS)}, got {self.residual!r}")
        if self.potential not in POTENTIALS:
            raise ValueError(f"drift.potential must be one of {list(POTENTIALS)}, got {self.potential!r}")
        if self.tokens_per_pass < 1:
            raise ValueError(f"drift.tokens_per_pass must be >= 1, got {self.tokens_per_pass}")

    @property
    def sketches_residual(self) -> bool:
        return self.residual == "sketch"

    @property
    def batches_potential(self) -> bool:
        """True when an actor computes f in batched passes per call (``residual: none``, ``potential: jvp | step``)."""
        return self.residual == "none" and self.potential != "gradient"

    def statistics(
        self, objective: CrossEntropyObjective, params: Params, generator: torch.Generator
    ) -> BatchStatistics:
        from d3ray.influence.statistics import gradient_statistics

        return gradient_statistics(objective, params)
