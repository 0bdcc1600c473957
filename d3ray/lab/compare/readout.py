"""Read-outs of an eval curve and the power of a paired comparison: pure functions.

A run's final loss is one noisy point of its curve; at the tiny scale it is a chaotic read-out
(docs/results/README.md: order noise as large as seed noise). Two steadier read-outs of the same
curve, over the evaluations after ``after_step`` (the shared trunk's end: what the arms did alone):

    last_k_mean   mean of the last k evaluations
    auc           area under the curve (trapezoids) divided by its step span: the curve's mean height

Power (the seeds a paired t-test needs): with paired differences of sd s and a true mean effect d,
the two-sided test at level α has power P(|T| > t_{1−α/2, n−1}) where T follows the noncentral t with
n − 1 degrees of freedom and noncentrality d·√n / s. :func:`seeds_for_power` is the smallest n ≥ 2
reaching the target power (80%), searched upwards from the normal approximation
n ≈ ((z_{1−α/2} + z_{power}) · s / d)². The D3 paper's claim, −4.2% perplexity, is a loss change of
ln(1 − 0.042) nats (:data:`PAPER_EFFECT_NATS`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

READOUTS = ("final", "last_k_mean", "auc")
#: The D3 paper's pre-training claim, −4.2% relative perplexity, as a loss difference in nats.
PAPER_EFFECT_NATS = math.log(1.0 - 0.042)


def readout_key(metric: str, readout: str, k: int) -> str:
    """The report's key of ``metric`` under ``readout``: ``eval/mean_loss``, ``eval/mean_loss@last3``,
    ``eval/mean_loss@auc``."""
    if readout == "final":
        return metric
    if readout == "last_k_mean":
        return f"{metric}@last{k}"
    if readout == "auc":
        return f"{metric}@auc"
    raise ValueError(f"report.metric={readout!r} must be one of {', '.join(READOUTS)}")


def _after(steps: Sequence[int], values: Sequence[float], after_step: int) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(steps, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    keep = (s > after_step) & np.isfinite(v)
    return s[keep], v[keep]


def last_k_mean(steps: Sequence[int], values: Sequence[float], k: int, after_step: int = 0) -> float:
    """Mean of the last ``k`` evaluations after ``after_step`` (fewer if fewer exist; NaN if none)."""
    _, v = _after(steps, values, after_step)
    return float(v[-k:].mean()) if v.size else float("nan")


def curve_auc(steps: Sequence[int], values: Sequence[float], after_step: int = 0) -> float:
    """Area under the eval curve after ``after_step`` (trapezoids) over its step span: the curve's mean
    height. One evaluation: its value; none: NaN."""
    s, v = _after(steps, values, after_step)
    if v.size == 0:
        return float("nan")
    if v.size == 1:
        return float(v[0])
    area = float(np.sum((v[1:] + v[:-1]) / 2.0 * np.diff(s)))
    return area / float(s[-1] - s[0])


def paired_power(effect: float, sd: float, n: int, alpha: float = 0.05) -> float:
    """Power of the two-sided paired t-test at level ``alpha`` with ``n`` pairs, true mean difference
    ``effect`` and sd of the differences ``sd`` (noncentral t)."""
    from scipy import stats

    if n < 2 or not (math.isfinite(effect) and math.isfinite(sd)) or sd <= 0:
        return float("nan")
    df = n - 1
    crit = float(stats.t.ppf(1.0 - alpha / 2.0, df))
    nc = abs(effect) * math.sqrt(n) / sd
    return float(stats.nct.sf(crit, df, nc) + stats.nct.cdf(-crit, df, nc))


def seeds_for_power(effect: float, sd: float, power: float = 0.8, alpha: float = 0.05,
                    limit: int = 1_000_000) -> float:
    """The fewest seeds (pairs, ≥ 2) for which the paired t-test detects ``effect`` with ``power``.

    Returns:
        n, or ``inf`` when the effect is 0, the sd unknown (NaN, fewer than 2 pairs) or n > ``limit``.
    """
    from scipy import stats

    if not (math.isfinite(effect) and math.isfinite(sd)) or effect == 0 or sd < 0:
        return float("inf")
    if sd == 0:
        return 2.0
    z = float(stats.norm.ppf(1.0 - alpha / 2.0) + stats.norm.ppf(power))
    n = max(2, int(math.floor((z * sd / abs(effect)) ** 2)))
    if n > limit:
        return float("inf")
    while paired_power(effect, sd, n, alpha) < power:  # the t test needs a little more than the z guess
        n += 1
        if n > limit:
            return float("inf")
    while n > 2 and paired_power(effect, sd, n - 1, alpha) >= power:
        n -= 1
    return float(n)
