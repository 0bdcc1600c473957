"""Influence stage: sketched second-order influence between the batches of a chunk (ARCHITECTURE.md §1).

Pure parts (no Ray): :mod:`~d3ray.influence.statistics` (per-batch loss, gradient, Hessian diagonal;
exact look-ahead), :mod:`~d3ray.influence.sketch` (JL maps), :mod:`~d3ray.influence.control_variate`,
:mod:`~d3ray.influence.influence` (A, S, merging). :class:`~d3ray.influence.worker.InfluenceWorker` is
the thin actor class. Importing this package loads only the configs and the numpy merge functions;
``InfluenceWorker`` (torch, transformers) is imported on first access.
"""

from __future__ import annotations

from typing import Any

from d3ray.influence.config import (
    ESTIMATORS,
    GaussianSketchConfig,
    IdentitySketchConfig,
    InfluenceConfig,
    SjltSketchConfig,
    SketchConfig,
)
from d3ray.influence.influence import (
    BatchSketches,
    LookaheadRows,
    Reference,
    influence_from_lookahead,
    influence_from_sketches,
    influence_matrices,
    mean_reference,
    nonfinite_rows,
)

__all__ = [
    "ESTIMATORS",
    "BatchSketches",
    "GaussianSketchConfig",
    "IdentitySketchConfig",
    "InfluenceConfig",
    "InfluenceWorker",
    "LookaheadRows",
    "Reference",
    "SjltSketchConfig",
    "SketchConfig",
    "influence_from_lookahead",
    "influence_from_sketches",
    "influence_matrices",
    "mean_reference",
    "nonfinite_rows",
]


def __getattr__(name: str) -> Any:
    if name == "InfluenceWorker":
        from d3ray.influence.worker import InfluenceWorker

        return InfluenceWorker
    raise AttributeError(f"module 'd3ray.influence' has no attribute {name!r}")
