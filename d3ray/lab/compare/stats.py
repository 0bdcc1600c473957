"""Statistics over seeds: summaries, paired comparisons against a baseline arm, verdicts.

Pure functions on ``{seed: value}`` mappings, so that they are tested on constructed tables.

Arms are compared *paired by seed*: the same seed gives both arms the same model initialisation,
data stream and eval set, so the seed-to-seed variation common to both cancels in the per-seed
difference d_s = arm_s − baseline_s. Over the n seeds both have:

    mean d̄, sd s_d (n − 1 in the denominator), se = s_d / √n
    confidence interval  d̄ ± t_{(1+c)/2, n−1} · se          (Student t, c = 0.95 by default)
    p-value              scipy.stats.ttest_rel (two-sided paired t-test; t = d̄ / se)
    relative change      mean(arm) / mean(baseline) − 1 over the paired seeds

The verdict: *better* / *worse* when the interval excludes 0 (for a lower-is-better metric,
better = the interval lies below 0), else *no difference beyond seed noise*; *too few seeds* with
fewer than 2 pairs. With 3 seeds t_{0.975, 2} = 4.30: only a difference about 2.5 times its
seed-to-seed spread is called. A percentile bootstrap interval (:func:`bootstrap_interval`) is
given beside the t interval; with a handful of seeds it is too narrow (it cannot see beyond the
values it has), so the verdict uses the t interval.

Several arms against one baseline are several tests: at level α each, some "better" or "worse" among
m arms is likely by chance alone. The p-values of a metric's comparisons are adjusted together by
Holm's step-down rule (:func:`holm_adjusted`, which controls the chance of any false call at α
without assuming independence), and a *better* / *worse* verdict stands only where the adjusted p is
still ≤ α = 1 − c; otherwise it reads *no difference beyond seed noise* (:func:`holm_verdicts`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

BETTER, WORSE, TIE, FEW = "better", "worse", "no difference beyond seed noise", "too few seeds"


@dataclass(frozen=True)
class Summary:
    """Mean and sample standard deviation (n − 1) of the finite values."""

    n: int
    mean: float
    std: float

    def format(self, digits: int = 4) -> str:
        if self.n == 0:
            return "n/a"
        std = f" ± {self.std:.{digits}f}" if self.n > 1 else ""
        return f"{self.mean:.{digits}f}{std}"


def summarize(values: Sequence[float] | Mapping[int, float]) -> Summary:
    """Summary of the finite values (a mapping's values)."""
    data = np.asarray([v for v in (values.values() if isinstance(values, Mapping) else values)
                       if v is not None and math.isfinite(v)], dtype=np.float64)
    if data.size == 0:
        return Summary(0, float("nan"), float("nan"))
    return Summary(int(data.size), float(data.mean()), float(data.std(ddof=1)) if data.size > 1 else float("nan"))


@dataclass(frozen=True)
class PairedComparison:
    """An arm against the baseline over the seeds both have a finite value for."""

    n: int
    mean_diff: float
    """d̄ = mean over seeds of (arm − baseline)."""
    std_diff: float
    ci_low: float
    ci_high: float
    p_value: float
    rel_change: float
    """mean(arm) / mean(baseline) − 1 over the paired seeds."""
    wins: int
    """Seeds where the arm is better than the baseline."""
    verdict: str
    """:data:`BETTER`, :data:`WORSE`, :data:`TIE` or :data:`FEW`."""
    boot_low: float = float("nan")
    boot_high: float = float("nan")
    p_holm: float = float("nan")
    """``p_value`` adjusted by Holm over the metric's comparisons (:func:`holm_verdicts`); NaN before."""
    family: int = 1
    """How many comparisons ``p_holm`` was adjusted over."""


def paired_comparison(arm: Mapping[int, float], baseline: Mapping[int, float], lower_is_better: bool = True,
                      confidence: float = 0.95) -> PairedComparison:
    """Paired t-test and interval of ``arm − baseline`` over the seeds both have (finite values).

    Args:
        arm, baseline: seed → metric value.
        lower_is_better: losses and perplexities (True), accuracies and exact match (False).
        confidence: level of the interval (its complement is the test's two-sided level).
    """
    from scipy import stats

    seeds = sorted(s for s in arm if s in baseline and _finite(arm[s]) and _finite(baseline[s]))
    a = np.asarray([arm[s] for s in seeds], dtype=np.float64)
    b = np.asarray([baseline[s] for s in seeds], dtype=np.float64)
    n = len(seeds)
    if n == 0:
        nan = float("nan")
        return PairedComparison(0, nan, nan, nan, nan, nan, nan, 0, FEW)
    d = a - b
    mean = float(d.mean())
    rel = float(a.mean() / b.mean() - 1.0) if b.mean() != 0 else float("nan")
    wins = int(np.sum(d < 0) if lower_is_better else np.sum(d > 0))
    if n < 2:
        nan = float("nan")
        return PairedComparison(n, mean, nan, nan, nan, nan, rel, wins, FEW)
    sd = float(d.std(ddof=1))
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)
    if sd == 0.0:  # every seed moved by exactly the same amount: the t statistic is infinite (or 0/0)
        p = 1.0 if mean == 0.0 else 0.0
    else:
        p = float(stats.ttest_rel(a, b).pvalue)
    low, high = mean - half, mean + half
    boot_low, boot_high = bootstrap_interval(d, confidence)
    return PairedComparison(n, mean, sd, low, high, p, rel, wins, verdict(low, high, lower_is_better),
                            boot_low, boot_high)


def verdict(ci_low: float, ci_high: float, lower_is_better: bool = True) -> str:
    """:data:`BETTER` / :data:`WORSE` when the interval of arm − baseline excludes 0, else :data:`TIE`."""
    if not (_finite(ci_low) and _finite(ci_high)):
        return FEW
    if ci_high < 0:
        return BETTER if lower_is_better else WORSE
    if ci_low > 0:
        return WORSE if lower_is_better else BETTER
    return TIE


def holm_adjusted(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order (NaN stays NaN and does not count in m).

    With the m finite p-values sorted ascending, p_(1) ≤ … ≤ p_(m): adjusted p_(i) =
    max_{j ≤ i} min(1, (m − j + 1) · p_(j)). Rejecting where the adjusted p ≤ α is Holm's rule:
    reject p_(1), p_(2), … while p_(i) ≤ α / (m − i + 1), and stop at the first that is not.
    """
    finite = sorted((p, i) for i, p in enumerate(p_values) if _finite(p))
    out = [float("nan")] * len(p_values)
    m, running = len(finite), 0.0
    for rank, (p, i) in enumerate(finite):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


def holm_verdicts(comparisons: Sequence[PairedComparison | None],
                  confidence: float = 0.95) -> list[PairedComparison | None]:
    """The comparisons of one metric with ``p_holm`` set; a better / worse verdict whose adjusted p
    exceeds α = 1 − ``confidence`` becomes :data:`TIE`. ``None`` entries (the baseline) stay None."""
    from dataclasses import replace

    p = [c.p_value if c is not None and c.verdict != FEW else float("nan") for c in comparisons]
    adjusted = holm_adjusted(p)
    family = sum(_finite(x) for x in p)
    out: list[PairedComparison | None] = []
    for c, q in zip(comparisons, adjusted, strict=True):
        if c is None:
            out.append(None)
            continue
        called = c.verdict in (BETTER, WORSE) and _finite(q) and q > 1.0 - confidence
        out.append(replace(c, p_holm=q, family=family, verdict=TIE if called else c.verdict))
    return out


def bootstrap_interval(diffs: Sequence[float], confidence: float = 0.95, resamples: int = 10_000,
                       seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``diffs`` (resampling seeds with replacement)."""
    d = np.asarray(diffs, dtype=np.float64)
    if d.size < 2:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, d.size, size=(resamples, d.size))].mean(axis=1)
    alpha = (1.0 - confidence) / 2
    return float(np.quantile(means, alpha)), float(np.quantile(means, 1.0 - alpha))


def lower_is_better(metric: str) -> bool:
    """Losses, perplexities and compute: lower is better; accuracies and exact match: higher."""
    last = metric.rsplit("/", 1)[-1]
    return not (last.startswith("acc") or "exact_match" in last or last in ("f1", "bleu", "rouge"))


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)
