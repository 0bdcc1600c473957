"""Typed configs of the influence stage: which estimator, which sketch, which cost knobs.

``InfluenceConfig`` is what the pipeline hands to every :class:`~d3ray.influence.worker.InfluenceWorker`;
its ``estimator`` is a registered family (:mod:`d3ray.influence.estimators`) and ``SketchConfig`` is one (``type: sjlt | gaussian | identity``) whose ``build()`` makes
the Johnson-Lindenstrauss map P of docs/design/method.md §4. Every field that shapes P (type, k, s,
seed) must be equal on all workers of a run, since sketches made with different P cannot be multiplied
together; holding one frozen config per run is how the pipeline guarantees it.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from d3ray.influence.estimators import DriftConfig, EstimatorConfig
from d3ray.registry import ChoiceConfig

if TYPE_CHECKING:
    from d3ray.influence.sketch import Sketch

logger = logging.getLogger(__name__)

#: ``none``: Δθ_i = −γ·g_i (the paper); ``adam``: the AdamW step of the shipped optimizer state.
PRECONDITIONERS = ("none", "adam")

__all__ = [
    "PRECONDITIONERS",
    "GaussianSketchConfig",
    "IdentitySketchConfig",
    "InfluenceConfig",
    "SjltSketchConfig",
    "SketchConfig",
]

class SketchConfig(ChoiceConfig):
    """A JL sketch P: R^d → R^k, selected by ``type``."""

    def build(self) -> Sketch:
        raise NotImplementedError


@SketchConfig.register("sjlt")
@dataclass(frozen=True, kw_only=True)
class SjltSketchConfig(SketchConfig):
    """Sparse JL transform (Kane & Nelson 2014, block construction): s nonzeros ±1/√s per coordinate."""

    k: int = 16384
    """Sketch dimension. The paper uses k ≈ 3500; on gpt2-small after 1,000 steps (``d3ray bench
    influence``, 10 chunks of 8) k = 3500 / 8192 / 16384 order a chunk with median regret 0.20 / 0.10 /
    0.06 against the exact look-ahead at about the same cost per scored batch (an sjlt sketch does O(s)
    work per coordinate, whatever k); the rows shipped per batch grow with k (4·k bytes per sketched
    statistic). Lower it where influence time, not order quality, is the constraint."""
    s: int = 4
    """Nonzeros per coordinate (s = 1 is CountSketch); k is split into s blocks of about k/s rows."""
    seed: int = 0
    """Seed of P; the same seed gives the same P in every process and on every device."""
    cache_mb: float = 1024.0
    """Memory allowed for caching the hashed row indices and signs (recomputed beyond it)."""

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"sketch.k must be >= 1, got {self.k}")
        if not 1 <= self.s <= self.k:
            raise ValueError(f"sketch.s must be in [1, k={self.k}], got {self.s}")
        if self.seed < 0:
            raise ValueError(f"sketch.seed must be >= 0, got {self.seed}")
        if self.cache_mb < 0:
            raise ValueError(f"sketch.cache_mb must be >= 0, got {self.cache_mb}")

    def build(self) -> Sketch:
        from d3ray.influence.sketch import SparseJLSketch

        return SparseJLSketch(k=self.k, s=self.s, seed=self.seed, cache_bytes=int(self.cache_mb * 2**20))


@SketchConfig.register("gaussian")
@dataclass(frozen=True, kw_only=True)
class GaussianSketchConfig(SketchConfig):
    """Dense Gaussian (or Rademacher) JL map, generated block by block from the seed: GPUs, small d."""

    k: int = 3500
    """Sketch dimension."""
    seed: int = 0
    """Seed of P; the same seed gives the same P in processes on the same device type."""
    block_size: int = 512
    """Columns of P per seeded block (each parameter rounds up to whole blocks; memory k · block_size)."""
    distribution: str = "gaussian"
    """Entries of √k·P: ``gaussian`` (N(0, 1)) or ``rademacher`` (±1)."""
    cache_mb: float = 256.0
    """Memory allowed for caching generated blocks of P (regenerated beyond it)."""

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"sketch.k must be >= 1, got {self.k}")
        if self.seed < 0:
            raise ValueError(f"sketch.seed must be >= 0, got {self.seed}")
        if self.block_size < 1:
            raise ValueError(f"sketch.block_size must be >= 1, got {self.block_size}")
        if self.distribution not in ("gaussian", "rademacher"):
            raise ValueError(
                f"sketch.distribution must be 'gaussian' or 'rademacher', got {self.distribution!r}"
            )
        if self.cache_mb < 0:
            raise ValueError(f"sketch.cache_mb must be >= 0, got {self.cache_mb}")

    def build(self) -> Sketch:
        from d3ray.influence.sketch import GaussianSketch

        return GaussianSketch(
            k=self.k,
            seed=self.seed,
            block_size=self.block_size,
            distribution=self.distribution,
            cache_bytes=int(self.cache_mb * 2**20),
        )


@SketchConfig.register("identity")
@dataclass(frozen=True, kw_only=True)
class IdentitySketchConfig(SketchConfig):
    """No sketch: k = d, the flattened vectors themselves (exact inner products; tests and references)."""

    def build(self) -> Sketch:
        from d3ray.influence.sketch import IdentitySketch

        return IdentitySketch()


@dataclass(frozen=True, kw_only=True)
class InfluenceConfig:
    """How the influence workers estimate A (L x L) and S = Aᵀ − A for a chunk (docs/design/method.md §5).

    The defaults are the knobs ``d3ray bench influence`` measured best at <= 1.0x the cost of a
    training step per scored batch (docs/results/influence-fidelity-cost-2026-12-01-to-03.md).
    """

    estimator: EstimatorConfig = field(default_factory=DriftConfig)
    """Estimator (``type: drift | first_order | fisher | gnb | hutchinson | lookahead``, or a plain name).

    Default ``drift`` (the potential alone, ``residual: none``): with the AdamW step (the default
    preconditioner) the first-order term is not symmetric and carries the order, and its dominant part is
    the drift potential η·(f_j − f_i), computed exactly (README.md, "The drift potential, exact"):
    ``d3ray bench influence`` on gpt2-small @1000 measures median regret 0.02 against the exact look-ahead
    at 0.21x a training step per scored batch, against 0.06 at 0.72x for the sketched ``first_order``
    (the default before). With ``preconditioner: none`` there is no drift and first_order/drift give
    S ≡ 0: pick a curvature estimator there (fisher).
    """
    preconditioner: str = "adam"
    """The step a batch causes: ``none`` (−γ·g, the paper) or ``adam`` (the trainers' AdamW step from the
    optimizer state shipped with the weights snapshot; γ is then unused: the step size is the lr)."""
    sketch: SketchConfig = field(default_factory=SjltSketchConfig)
    """JL map applied to g, u ⊙ u, the Hessian diagonal and u (``type: sjlt | gaussian | identity``)."""
    gamma: float = 1e-3
    """Look-ahead step γ of the plain step Δθ = −γ·g (preconditioner ``none``); scales S by γ²/2 in the
    Taylor path. ``lookahead`` takes differences of losses: in float32 γ = 1e-3 is mostly rounding
    (Spearman 0.6-0.8 against float64 on the tiny GPT-2), γ >= 1e-2 is exact to the order; else use
    dtype float64."""
    param_filter: str | None = None
    """Regex (``re.search``) on parameter names; only matching parameters take part. None = all."""
    sample_fraction: float = 0.125
    """Fraction of each batch's sequences used (at least one), chosen by (seed, batch id): the cost lever
    (at 1/8 of the batch every Taylor estimator costs well under a training step; README.md)."""
    control_variate: bool = True
    """Sketch residuals against full-dimension reference directions, with the reference terms exact."""
    seed: int = 0
    """Seed of the random draws per batch: sequence subset, Hutchinson probes, GNB labels."""
    dtype: str = "float32"
    """Compute dtype of the model and statistics: float32, or float64 (validation, look-ahead on CPU)."""
    device: str = "auto"
    """``auto`` (cuda when available, else cpu), ``cpu``, ``cuda`` or ``cuda:N``."""

    def __post_init__(self) -> None:
        if not isinstance(self.estimator, EstimatorConfig):
            raise ValueError(f"estimator must be an EstimatorConfig, got {type(self.estimator).__name__}")
        if self.preconditioner not in PRECONDITIONERS:
            raise ValueError(f"preconditioner must be one of {list(PRECONDITIONERS)}, got {self.preconditioner!r}")
        if not isinstance(self.sketch, SketchConfig):
            raise ValueError(f"sketch must be a SketchConfig, got {type(self.sketch).__name__}")
        if not self.gamma > 0 or self.gamma != self.gamma or self.gamma == float("inf"):
            raise ValueError(f"gamma must be a positive finite number, got {self.gamma}")
        if self.param_filter is not None:
            try:
                re.compile(self.param_filter)
            except re.error as err:
                raise ValueError(
                    f"param_filter is not a valid regex: {self.param_filter!r} ({err})"
                ) from None
        if not 0.0 < self.sample_fraction <= 1.0:
            raise ValueError(f"sample_fraction must be in (0, 1], got {self.sample_fraction}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        if self.dtype not in ("float32", "float64"):
            raise ValueError(f"dtype must be 'float32' or 'float64', got {self.dtype!r}")
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {self.device!r}")

    @property
    def needs_optimizer_state(self) -> bool:
        """The weights snapshot must carry the optimizer state (an :class:`AdamWState`)."""
        return self.preconditioner == "adam"

    @property
    def potential_alone(self) -> bool:
        """S is the exact AdamW drift potential alone, computed in batched forwards (``drift`` with
        ``residual: none`` and ``potential: step | jvp``, the ``adam`` preconditioner): a chunk's batches
        give one number each, and its LOP is solved by the sort by f."""
        return self.estimator.batches_potential and self.needs_optimizer_state

    def check_shardable(self) -> None:
        """Raise ValueError unless this config can run on parameter shards (D3's ``placement: {type:
        in_trainer}`` asks; d3ray/train/scheduling/sharded_influence.py says why the other estimators cannot)."""
        if not self.estimator.runs_on_shards:
            sharded = [name for name in EstimatorConfig.known() if EstimatorConfig.lookup(name).runs_on_shards]
            raise ValueError(
                f"schedule.placement.type=in_trainer supports the estimators {sharded}, not "
                f"{self.estimator.type_name!r} (d3ray/train/scheduling/sharded_influence.py says why); use "
                "schedule.placement.type=actors for it"
            )
        if self.sketch.type_name == "identity" and not self.potential_alone:  # the potential alone sketches nothing
            raise ValueError("schedule.placement.type=in_trainer needs a JL sketch (sjlt or gaussian): the identity "
                             "sketch cannot be split over parameter shards")

    @property
    def gamma_changes_order(self) -> bool:
        """Whether γ can change the order: only the exact look-ahead with the plain step.

        Under the Taylor estimators with the plain step γ only scales S by γ²/2; under ``adam`` the
        step size is the optimizer's learning rate and γ is not used.
        """
        return self.estimator.is_exact_lookahead and self.preconditioner == "none"
