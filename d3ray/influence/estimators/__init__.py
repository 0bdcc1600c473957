"""Influence estimators, one module each, registered on :class:`EstimatorConfig` (``type: <name>``).

| name | second-order term | cost per batch |
|---|---|---|
| ``first_order`` | none | 1 backward |
| ``drift`` | none; AdamW drift potential exact, residual sketched or dropped | 1 backward + 1 dot product |
| ``fisher`` | per-example empirical Fisher diagonal | 1 + b per-example backwards (vmapped) |
| ``gnb`` | Gauss-Newton-Bartlett diagonal (Sophia-G) | 1 + samples backwards |
| ``hutchinson`` | Hutchinson diagonal (Sophia-H, the paper's) | 1 backward + probes HVPs |
| ``lookahead`` | exact definition (no Taylor) | L forwards per row |

Importing this package registers all of them (docs/design/conventions.md §2: explicit registration).
"""

from d3ray.influence.estimators.base import EstimatorConfig
from d3ray.influence.estimators.drift import DriftConfig
from d3ray.influence.estimators.first_order import FirstOrderConfig
from d3ray.influence.estimators.fisher import FisherConfig, fisher_diagonal
from d3ray.influence.estimators.gnb import GnbConfig, gnb_samples
from d3ray.influence.estimators.hutchinson import HutchinsonConfig, hutchinson_samples
from d3ray.influence.estimators.lookahead import LookaheadConfig, lookahead_influence

__all__ = [
    "DriftConfig",
    "EstimatorConfig",
    "FirstOrderConfig",
    "FisherConfig",
    "GnbConfig",
    "HutchinsonConfig",
    "LookaheadConfig",
    "fisher_diagonal",
    "gnb_samples",
    "hutchinson_samples",
    "lookahead_influence",
]
