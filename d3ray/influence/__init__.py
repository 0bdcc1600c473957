"""Influence stage: sketched second-order influence between the batches of a chunk (docs/design/method.md §5).

Pure parts (no Ray): :mod:`~d3ray.influence.estimators` (registered estimators, one module each),
:mod:`~d3ray.influence.statistics` (the batch loss; exact-Hessian Taylor), :mod:`~d3ray.influence.optimizer`
(the step a batch causes: plain or AdamW), :mod:`~d3ray.influence.sketch` (JL maps),
:mod:`~d3ray.influence.control_variate`, :mod:`~d3ray.influence.chunk` (``sketch_chunk``,
``lookahead_rows``), :mod:`~d3ray.influence.influence` (A, S, merging).
:class:`~d3ray.influence.worker.InfluenceWorker` is the thin actor class. Importing this package loads only the configs and the numpy merge functions;
``InfluenceWorker`` (torch, transformers) is imported on first access.
"""

from __future__ import annotations

from typing import Any

from d3ray.influence.config import (
    PRECONDITIONERS,
    GaussianSketchConfig,
    IdentitySketchConfig,
    InfluenceConfig,
    SjltSketchConfig,
    SketchConfig,
)
from d3ray.influence.estimators import (
    DriftConfig,
    EstimatorConfig,
    FirstOrderConfig,
    FisherConfig,
    GnbConfig,
    HutchinsonConfig,
    LookaheadConfig,
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
    "PRECONDITIONERS",
    "AdamWState",
    "BatchSketches",
    "DriftConfig",
    "EstimatorConfig",
    "FirstOrderConfig",
    "FisherConfig",
    "GnbConfig",
    "HutchinsonConfig",
    "LookaheadConfig",
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
    if name == "AdamWState":
        from d3ray.influence.optimizer import AdamWState

        return AdamWState
    if name == "InfluenceWorker":
        from d3ray.influence.worker import InfluenceWorker

        return InfluenceWorker
    raise AttributeError(f"module 'd3ray.influence' has no attribute {name!r}")
