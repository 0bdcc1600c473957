"""The variants ``d3ray bench influence`` scores: estimator families, Hutchinson probe counts, preconditioners.

A variant is (estimator, probes) at a preconditioner; :func:`variants` says which run at a sample fraction
(the full batch only for the families ``--full-batch-estimators`` names), :func:`estimator_config` builds
the production config of one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from d3ray.influence.estimators import EstimatorConfig

ESTIMATORS = ("first_order", "drift", "drift_only", "drift_jvp", "drift_step", "fisher", "gnb", "hutchinson")
#: drift (potential.py): the exact AdamW drift potential + the sketched residual (``residual: sketch``);
#: the potential alone (``residual: none``) computed three ways (``potential``): drift_only ⟨g_i, w⟩ from
#: one forward + backward per batch (``gradient``), drift_jvp by batched forward-mode AD (``jvp``),
#: drift_step as the drift step's loss change from two batched forwards (``step``). All need the AdamW
#: step: scored with preconditioner adam only.
ADAM_ONLY = ("drift", "drift_only", "drift_jvp", "drift_step")
_POTENTIAL_OF = {"drift_only": "gradient", "drift_jvp": "jvp", "drift_step": "step"}
PROBES = (1, 2, 4, 8)


def variants(sample_fraction: float, full_batch: str, estimators: tuple[str, ...] = ESTIMATORS) -> list[tuple[str, int]]:
    """(estimator, probes) pairs scored at this sample fraction; probes 0 = not hutchinson.

    Hutchinson runs up to fraction · probes <= 1 (8 probes at 1/8 of the batch, 2 at half of it): more
    costs several training steps per batch, off the frontier of interest (<= 1x) and slow on a CPU.
    """
    out = [(e, 0) for e in estimators if e != "hutchinson"]
    if "hutchinson" in estimators:
        out += [("hutchinson", n) for n in PROBES if sample_fraction * n <= 1.0 or n == 1]
    if sample_fraction < 1.0:
        return out
    allowed = {}
    for item in (x for x in full_batch.split(",") if x):
        name, _, n = item.partition(":")
        allowed[name] = int(n) if n else max(PROBES)
    return [(e, n) for e, n in out if e in allowed and n <= allowed[e]]


def estimator_families(names: str) -> tuple[str, ...]:
    """``--estimators``: a comma list of known families, in the bench's order."""
    asked = [n for n in names.split(",") if n]
    unknown = sorted(set(asked) - set(ESTIMATORS))
    if unknown or not asked:
        raise ValueError(f"--estimators {names!r}: unknown {unknown}; known: {', '.join(ESTIMATORS)}")
    return tuple(e for e in ESTIMATORS if e in asked)


def estimator_config(name: str, probes: int) -> EstimatorConfig:
    """The production estimator config of a variant (``drift_*``: the drift with ``residual: none``)."""
    from d3ray.influence.estimators import DriftConfig, EstimatorConfig, HutchinsonConfig

    if name == "drift":
        return DriftConfig(residual="sketch")
    if name in _POTENTIAL_OF:
        return DriftConfig(residual="none", potential=_POTENTIAL_OF[name])
    return HutchinsonConfig(probes=probes) if name == "hutchinson" else EstimatorConfig.lookup(name)()


def preconditioners(name: str) -> tuple[str, ...]:
    """The preconditioners a family is scored with (the drift ones need the AdamW step: adam only)."""
    return ("adam",) if name in ADAM_ONLY else ("none", "adam")


def variant_label(name: str, probes: int, shared: bool = False) -> str:
    """The record's ``variant``: ``hutchinson<n>`` for n probes, ``*_shared`` for one h per chunk."""
    base = f"hutchinson{probes}" if name == "hutchinson" else name
    return base + ("_shared" if shared else "")
