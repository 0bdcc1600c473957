"""TSDS: selection probabilities that transport the target distribution onto the candidates, with a
density-corrected diversity regulariser; then the kept candidates are drawn by them.

Liu, Karbasi & Rekatsinas 2024, "TSDS: Data Selection for Task-Specific Model Finetuning" (NeurIPS;
arXiv 2410.11303), §3 (the optimisation problem, the G_KDE regulariser) and its KNN-KDE algorithm
(the authors' ``tsds.py``, ZifanL/TSDS). With M target ("query") embeddings q_j and N candidate
embeddings x_i, the selection distribution p over the candidates is the marginal of a transport plan
γ (M × N) that moves mass 1/M from every q_j onto the candidates:

    min_γ  (α / C)·Σ_{j,i} γ_ji·‖q_j − x_i‖  +  (1 − α)·G_KDE(γ),     Σ_i γ_ji = 1/M,   p_i = Σ_j γ_ji

G_KDE penalises concentrating mass on a candidate relative to its kernel density
ρ_i = Σ_{i'} max(0, 1 − ‖x_i − x_i'‖² / σ²) (ρ_i ≥ 1; a near-duplicate cluster of size c has ρ ≈ c,
so the cluster together takes the mass of about one point). Its solution (the paper's connection to
nearest-neighbour search) has one level s > 0: each target sends its mass to its K nearest candidates
in order of distance, at most 1/(M·s·ρ_i) to candidate i, the rest to the next one. Raising s spreads
the mass to farther candidates (transport cost up, regulariser down); with the breakpoints
S_jk = Σ_{k'≤k} 1/ρ_jk' (target j's first k + 1 neighbours exactly saturated) and the marginal cost
c_jk = Σ_{k'≤k} (d_j,k+1 − d_jk') / ρ_jk' of spreading past them, s is the first breakpoint, in
increasing order, at which (α / C)·Σ_j c_j ≥ (1 − α)·M (Σ over each target's latest breakpoint).

Here, per chunk: the targets are the chosen held-out sets (all pooled), the candidates the window's
n sequences; embeddings are mean-pooled last hidden states of the current model (``reference:
current``) or of a fixed Hugging Face directory (``reference: PATH``), scaled to unit norm. Then the
k = L·B kept candidates are ``keep: sample`` (default) a seeded draw without replacement ∝ p (the
paper draws with replacement; distinct samples are needed here), by exponential keys log p + Gumbel
(Efraimidis & Spirakis 2006), or ``keep: top`` the k largest p. Candidates with p = 0 come after,
nearest to a target first.

Departures from the paper and why:
- Exact distances and densities over the window (n is small) instead of FAISS IVF search; ρ is over
  the whole window (the authors' code takes it over the union of the targets' neighbourhoods).
- Embeddings are scaled to unit norm, so that σ and C are scale-free (C ≈ 1 is "the scale of the
  norm of the embeddings", the authors' guidance for C); the defaults follow from that.
- K = min(``knn``, n) (the authors also cap K at N/10, too few on a window of tens of candidates).
- A target whose first neighbour alone exceeds its mass at level s gives that neighbour exactly 1/M
  (the authors' code would give it 1/(M·s·ρ) > 1/M in that corner case).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from d3ray.data.chunker import Chunk
from d3ray.schedule.scheduler import BuildContext
from d3ray.schedule.scoring import ScoringWorker
from d3ray.schedule.select.near import EmbeddedTargets, embed_batches
from d3ray.schedule.select.target import ScorerHead, put_target_sets, rank_scores, unit_rows

KEEP = ("sample", "top")


def pairwise_distances(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Euclidean distances (n, m) between the rows of a (n, d) and b (m, d), in float64."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    sq = (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * a @ b.T
    return np.sqrt(np.maximum(sq, 0.0))


def kde_densities(x: np.ndarray, sigma: float) -> np.ndarray:
    """ρ_i = Σ_i' max(0, 1 − ‖x_i − x_i'‖² / σ²) over all rows (itself included, so ρ ≥ 1); σ = 0: ones."""
    if sigma == 0:
        return np.ones(len(x))
    d2 = pairwise_distances(x, x) ** 2
    return np.maximum(0.0, 1.0 - d2 / sigma**2).sum(axis=1)


def tsds_probabilities(queries: np.ndarray, candidates: np.ndarray, alpha: float, C: float, knn: int,
                       sigma: float) -> np.ndarray:
    """TSDS's selection distribution p over the candidates (KNN-KDE; see the module docstring).

    Args:
        queries: (M, d) target embeddings.
        candidates: (N, d) candidate embeddings.
        alpha: α in [0, 1]: 1 = pure distribution alignment (all mass to nearest neighbours), 0 = most
            diverse within the neighbourhoods.
        C: scale of the transport cost (the scale of the embeddings' norms).
        knn: K, neighbours per target (capped at N).
        sigma: KDE kernel width σ (0 = no density correction).

    Returns:
        (N,) float64, non-negative, summing to 1.
    """
    M, N = len(queries), len(candidates)
    K = min(int(knn), N)
    D = pairwise_distances(queries, candidates)  # (M, N)
    neighbours = np.argsort(D, axis=1, kind="stable")[:, :K]  # (M, K) nearest first
    dist = np.take_along_axis(D, neighbours, axis=1)  # (M, K)
    inv = 1.0 / kde_densities(candidates, sigma)[neighbours]  # (M, K) 1/ρ
    level = None
    if K >= 2:
        levels = np.cumsum(inv, axis=1)[:, :K - 1]  # S_jk: neighbours 0..k exactly saturated
        costs = dist[:, 1:] * levels - np.cumsum(dist * inv, axis=1)[:, :K - 1]  # c_jk
        js, ks = np.meshgrid(np.arange(M), np.arange(K - 1), indexing="ij")
        events = np.lexsort((js.ravel(), ks.ravel(), levels.ravel()))  # by level, then k, then j
        current = np.zeros(M)
        total = 0.0
        for e in events:
            j, k = divmod(int(e), K - 1)
            total += costs[j, k] - current[j]
            current[j] = costs[j, k]
            level = levels[j, k]
            if alpha / C * total >= (1.0 - alpha) * M:
                break
    if level is None:  # one candidate per target: all its mass to the nearest
        caps = np.full((M, K), np.inf)
    else:
        caps = inv / (M * level)  # (M, K) most a target sends to each neighbour
    before = np.cumsum(caps, axis=1) - caps  # mass sent to the nearer neighbours, if all were capped
    sent = np.clip(1.0 / M - before, 0.0, caps)
    sent[:, K - 1] = np.maximum(1.0 / M - before[:, K - 1], 0.0)  # the farthest takes what is left
    p = np.zeros(N)
    np.add.at(p, neighbours, sent)
    return p


def tsds_scores(p: np.ndarray, nearest: np.ndarray, keep: str, rng: np.random.Generator) -> np.ndarray:
    """Scores (n,) whose top k is the kept set: ``sample`` a draw without replacement ∝ p, or ``top``
    the largest p; candidates with p = 0 after, by ``nearest`` (distance to the nearest target)."""
    p = np.asarray(p, dtype=np.float64)
    if keep == "top":
        primary = p
    elif keep == "sample":
        with np.errstate(divide="ignore"):
            primary = np.where(p > 0, np.log(np.where(p > 0, p, 1.0)) + rng.gumbel(size=len(p)), -np.inf)
    else:
        raise ValueError(f"keep={keep!r} must be one of {KEEP}")
    return rank_scores(np.lexsort((np.arange(len(p)), np.asarray(nearest), -primary)))


@dataclass(frozen=True)
class TsdsScorer(EmbeddedTargets):
    """TSDS on the ScoringWorker (the :class:`~d3ray.schedule.scoring.Scorer` protocol)."""

    alpha: float
    C: float
    knn: int
    sigma: float
    keep: str
    seed: int
    chunk_id: int
    targets: Any

    def scores(self, worker: ScoringWorker, batches: list[Any], target: np.ndarray) -> np.ndarray:
        queries, candidates = unit_rows(target), unit_rows(embed_batches(worker, batches))
        p = tsds_probabilities(queries, candidates, self.alpha, self.C, self.knn, self.sigma)
        nearest = pairwise_distances(candidates, queries).min(axis=1)
        rng = np.random.default_rng([self.seed, self.chunk_id, 15485863])
        return tsds_scores(p, nearest, self.keep, rng)


class TsdsSelectHead(ScorerHead):
    def __init__(self, cfg: Any, ctx: BuildContext) -> None:
        self.target_ref = put_target_sets(ctx, cfg)  # a bad target_sets fails before an actor starts
        super().__init__(cfg, ctx, "tsds", fixed_model=None if cfg.reference == "current" else cfg.reference)

    def scorer_for(self, chunk: Chunk) -> TsdsScorer:
        cfg = self.cfg
        return TsdsScorer(alpha=cfg.alpha, C=cfg.C, knn=cfg.knn, sigma=cfg.sigma, keep=cfg.keep, seed=self.seed,
                          chunk_id=chunk.chunk_id, targets=self.target_ref)

