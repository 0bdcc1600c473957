"""The census's statistics: pure functions on held-out losses (lower is better).

Per chunk, the R random orders are the reference distribution of "an order": its sd is how much the
order matters here; a named order (D3, its reverse, the alternating one) gets a z-score against it and
a rank among it. Across chunks the z-scores get a t-interval, and per chunk the solver's objective of
every order is correlated with its held-out loss (does the objective predict the outcome?).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def _finite(values: Sequence[float]) -> np.ndarray:
    x = np.asarray(values, dtype=np.float64)
    return x[np.isfinite(x)]


def z_score(value: float, reference: Sequence[float]) -> float:
    """(value − mean) / sd of ``reference`` (sample sd, ddof 1); NaN when the sd is 0 or undefined."""
    ref = _finite(reference)
    if len(ref) < 2 or not math.isfinite(value):
        return float("nan")
    sd = float(ref.std(ddof=1))
    return (value - float(ref.mean())) / sd if sd > 0 else float("nan")


def rank_among(value: float, reference: Sequence[float]) -> int:
    """1 + the number of ``reference`` values strictly below ``value``: 1 = no reference order did better
    (the best possible rank), len(reference) + 1 = every one did."""
    return 1 + int((_finite(reference) < value).sum())


def beats_median(value: float, reference: Sequence[float]) -> bool:
    """Whether ``value`` is strictly below the median of ``reference``."""
    ref = _finite(reference)
    return bool(len(ref) and value < float(np.median(ref)))


def t_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): the Student-t interval of the mean of ``values`` (non-finite ones dropped);
    low = high = NaN for fewer than two values."""
    from scipy import stats

    x = _finite(values)
    if len(x) == 0:
        return float("nan"), float("nan"), float("nan")
    mean = float(x.mean())
    if len(x) < 2:
        return mean, float("nan"), float("nan")
    half = float(stats.t.ppf(0.5 + confidence / 2, len(x) - 1)) * float(x.std(ddof=1)) / math.sqrt(len(x))
    return mean, mean - half, mean + half


def t_statistic(values: Sequence[float]) -> float:
    """The one-sample t of the mean of ``values`` against 0: mean / (sd / √n), non-finite values dropped
    (NaN for fewer than two values or no spread). How many standard errors the mean lies from 0: what a
    census says with "|t| >= 2" across chunks.

    Example: (1, 2, 3) → 2 / (1 / √3) = 3.46.
    """
    x = _finite(values)
    if len(x) < 2 or x.std(ddof=1) == 0:
        return float("nan")
    return float(x.mean() / (x.std(ddof=1) / math.sqrt(len(x))))


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    """Pearson correlation over the pairs where both are finite; NaN with < 3 pairs or a constant side."""
    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    keep = np.isfinite(a) & np.isfinite(b)
    a, b = a[keep], b[keep]
    if len(a) < 3 or a.std() == 0 or b.std() == 0:
        return float("nan")
    return float(np.corrcoef(a, b)[0, 1])


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman rank correlation (Pearson on average ranks; ties share their mean rank)."""
    from scipy.stats import rankdata

    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    keep = np.isfinite(a) & np.isfinite(b)
    return pearson(rankdata(a[keep]), rankdata(b[keep]))


def half_of(position: int, L: int) -> str:
    """Which half of an order of L batches a 1-based ``position`` lies in: ``early`` (1 .. ⌊L/2⌋),
    ``late`` (⌈L/2⌉+1 .. L), or ``middle`` (the centre of an odd L)."""
    if position <= L // 2:
        return "early"
    return "late" if position > L - L // 2 else "middle"


def position_effect(positions: Sequence[int], losses: Sequence[float], L: int) -> dict[str, float | int | str | None]:
    """How the held-out loss moves with one batch's position (1..L) over orders of a chunk.

    Returns:
        ``{"n", "spearman", "pearson", "early_mean", "late_mean", "late_minus_early", "better"}``: the
        correlations between position and loss over the finite pairs (> 0: the later the batch, the higher
        the loss); the mean loss of the orders with the batch in the first and in the last half
        (:func:`half_of`) and their difference; ``better`` = ``"early"`` when the Spearman correlation is
        positive (the batch does least harm early), ``"late"`` when negative, None when 0 or undefined.
    """
    pos = np.asarray(positions, dtype=np.float64)
    loss = np.asarray(losses, dtype=np.float64)
    keep = np.isfinite(pos) & np.isfinite(loss)
    pos, loss = pos[keep], loss[keep]
    halves = np.asarray([half_of(int(p), L) for p in pos])
    early = loss[halves == "early"] if len(pos) else loss
    late = loss[halves == "late"] if len(pos) else loss
    early_mean = float(early.mean()) if len(early) else float("nan")
    late_mean = float(late.mean()) if len(late) else float("nan")
    rho = spearman(pos, loss)
    better = None if not math.isfinite(rho) or rho == 0 else ("early" if rho > 0 else "late")
    return {"n": int(len(pos)), "spearman": rho, "pearson": pearson(pos, loss), "early_mean": early_mean,
            "late_mean": late_mean, "late_minus_early": late_mean - early_mean, "better": better}


def domain_position(order: Sequence[int], batch_domains: Sequence[Sequence[str]], domain: str) -> float:
    """Where an order trains one domain: the mean position (1..L) of its sequences, each batch's position
    weighted by how many of them it holds (NaN when the chunk holds none). Late = trained near the end.

    Example: counts (0, 1, 2, 3) over batches 0..3: order (0, 1, 2, 3) → (1·2 + 2·3 + 3·4)/6 = 3.33;
    order (3, 2, 1, 0) → (3·1 + 2·2 + 1·3)/6 = 1.67.
    """
    counts = np.array([list(batch_domains[b]).count(domain) for b in order], dtype=np.float64)
    if counts.sum() == 0:
        return float("nan")
    return float((np.arange(1, len(order) + 1) * counts).sum() / counts.sum())


def momentum_applied(position: int, L: int, beta1: float, extra_steps: int = 0) -> float:
    """The fraction of the gradient of the batch trained at ``position`` (1..L) of a chunk that has reached
    the weights by the end of the chunk plus ``extra_steps`` more steps: 1 − β1^n, n = L − position + 1 +
    extra_steps.

    AdamW steps along m_t = β1·m_{t−1} + (1 − β1)·g_t (Loshchilov & Hutter 2019, Alg. 2), so the gradient
    g_s enters step t ≥ s with weight (1 − β1)·β1^(t−s); summed over the n steps s..s+n−1 that is
    1 − β1^n (the bias correction and the √v normalisation aside). Right after a chunk the last batch
    has had one step of its momentum (1 − β1 = 0.1 at β1 = 0.9) and the first L steps (0.57 at L = 8):
    a held-out loss read then favours whatever was trained early, which is what a recency control,
    read too soon, runs against.
    """
    if not 1 <= position <= L:
        raise ValueError(f"position {position} is not in 1..{L}")
    if not 0.0 <= beta1 < 1.0 or extra_steps < 0:
        raise ValueError(f"beta1 {beta1} must be in [0, 1) and extra_steps {extra_steps} >= 0")
    return 1.0 - beta1 ** (L - position + 1 + extra_steps)
