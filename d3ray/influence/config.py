"""Typed configs of the influence stage: which estimator, which sketch, which cost knobs.

``InfluenceConfig`` is what the pipeline hands to every :class:`~d3ray.influence.worker.InfluenceWorker`;
``SketchConfig`` is a registered family (``type: sjlt | gaussian | identity``) whose ``build()`` makes
the Johnson-Lindenstrauss map P of ARCHITECTURE.md section 1. Every field that shapes P (type, k, s,
seed) must be equal on all workers of a run, since sketches made with different P cannot be multiplied
together; holding one frozen config per run is how the pipeline guarantees it.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from d3ray.registry import ChoiceConfig

if TYPE_CHECKING:
    from d3ray.influence.sketch import Sketch

logger = logging.getLogger(__name__)

__all__ = [
    "ESTIMATORS",
    "GaussianSketchConfig",
    "IdentitySketchConfig",
    "InfluenceConfig",
    "SjltSketchConfig",
    "SketchConfig",
]

#: The estimators of ARCHITECTURE.md's table, cheapest first.
ESTIMATORS = ("first_order", "fisher", "gnb", "hutchinson", "lookahead")


class SketchConfig(ChoiceConfig):
    """A JL sketch P: R^d → R^k, selected by ``type``."""

    def build(self) -> Sketch:
        raise NotImplementedError


@SketchConfig.register("sjlt")
@dataclass(frozen=True, kw_only=True)
class SjltSketchConfig(SketchConfig):
    """Sparse JL transform (Kane & Nelson 2014, block construction): s nonzeros ±1/√s per coordinate."""

    k: int = 3500
    """Sketch dimension (the paper uses k ≈ 3500)."""
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
    """How the influence workers estimate A (L x L) and S = Aᵀ − A for a chunk (ARCHITECTURE.md §1)."""

    estimator: str = "hutchinson"
    """Second-order term: first_order, fisher, gnb, hutchinson (the paper's, default) or lookahead (exact).

    Fisher measured best for its cost on trained weights but is not yet validated in the D3 pipeline
    tests, so the default stays hutchinson. Measured (``d3ray bench influence``, GPT-2s after 100 AdamW steps, γ = 0.01): Spearman
    of S against the exact look-ahead fisher 0.79/0.83 (tiny/small) at ~2.2-3x a training step,
    hutchinson with 1 probe 0.50/0.52 at ~2.5-4.6x, gnb 0.61/0.41 at ~1.5-2.4x; with 8 probes/samples
    gnb 0.89/0.80 (6.5-9x) and hutchinson 0.82/0.69 (16-18x). At random init Fisher is poor (tests).
    """
    sketch: SketchConfig = field(default_factory=SjltSketchConfig)
    """JL map applied to g, g ⊙ g and the Hessian diagonal (``type: sjlt | gaussian | identity``)."""
    gamma: float = 1e-3
    """Look-ahead step γ of I(i→j) = ℓ(B_j; θ − γ g_i) − ℓ(B_j; θ); scales S by γ²/2 in the Taylor path.

    ``lookahead`` takes differences of losses: in float32 γ = 1e-3 is mostly rounding (Spearman 0.6-0.8
    against float64 on the tiny GPT-2), γ >= 1e-2 is exact to the order; else use dtype float64.
    """
    hutchinson_probes: int = 1
    """Rademacher probes z per batch for ``hutchinson`` (one Hessian-vector product each)."""
    gnb_samples: int = 1
    """Label samples per batch for ``gnb`` (one backward each)."""
    fisher_chunk: int = 8
    """Sequences per vmapped per-example-gradient call for ``fisher`` (memory: fisher_chunk · d)."""
    param_filter: str | None = None
    """Regex (``re.search``) on parameter names; only matching parameters take part. None = all."""
    sample_fraction: float = 1.0
    """Fraction of each batch's sequences used (at least one), chosen by (seed, batch id)."""
    control_variate: bool = True
    """Sketch residuals against full-dimension reference directions, with the reference terms exact."""
    seed: int = 0
    """Seed of the random draws per batch: sequence subset, Hutchinson probes, GNB labels."""
    dtype: str = "float32"
    """Compute dtype of the model and statistics: float32, or float64 (validation, look-ahead on CPU)."""
    device: str = "auto"
    """``auto`` (cuda when available, else cpu), ``cpu``, ``cuda`` or ``cuda:N``."""

    def __post_init__(self) -> None:
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"estimator must be one of {list(ESTIMATORS)}, got {self.estimator!r}")
        if not isinstance(self.sketch, SketchConfig):
            raise ValueError(f"sketch must be a SketchConfig, got {type(self.sketch).__name__}")
        if not self.gamma > 0 or self.gamma != self.gamma or self.gamma == float("inf"):
            raise ValueError(f"gamma must be a positive finite number, got {self.gamma}")
        if self.hutchinson_probes < 1:
            raise ValueError(f"hutchinson_probes must be >= 1, got {self.hutchinson_probes}")
        if self.gnb_samples < 1:
            raise ValueError(f"gnb_samples must be >= 1, got {self.gnb_samples}")
        if self.fisher_chunk < 1:
            raise ValueError(f"fisher_chunk must be >= 1, got {self.fisher_chunk}")
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
