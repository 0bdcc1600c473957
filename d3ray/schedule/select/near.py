"""NEAR: keep the candidates nearest to the target examples in embedding space.

The nearest-neighbour selector of DataFlex (OpenDCAI/DataFlex, ``offline_near_selector``: unit-norm
sentence embeddings, each target ("query") example's K nearest candidates by FAISS L2 search), the
representation-similarity baseline of targeted data selection (LESS's "RDS"). Per candidate x with unit embedding x̂ and the unit target embeddings ŷ_1..ŷ_M
(every chosen target set pooled):

    score(x) = mean of the ``neighbours`` largest cos(x̂, ŷ_j)          (neighbours = 1: the nearest one)

then the window's highest scores are kept. Embeddings are mean-pooled last hidden states (over each
sequence's valid tokens) of the current model (``reference: current``) or of a fixed Hugging Face
model directory (``reference: PATH``: no weights snapshots needed, the target embedded once).

Departure from DataFlex: it keeps each query's K nearest candidates of a whole dataset (a union of
per-query lists); a window of candidates has to be ranked as a whole, so each candidate is scored by
its similarity to its nearest targets instead. On unit vectors the L2 order and the cosine order agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from d3ray.data.chunker import Chunk
from d3ray.schedule.scheduler import BuildContext
from d3ray.schedule.scoring import ScoringWorker, sequence_arrays
from d3ray.schedule.select.target import ScorerHead, put_target_sets, target_arrays, target_key, unit_rows


def near_scores(candidates: np.ndarray, targets: np.ndarray, neighbours: int) -> np.ndarray:
    """Mean cosine similarity of each candidate to its ``neighbours`` most similar targets.

    Args:
        candidates: (n, H) embeddings.
        targets: (M, H) embeddings.
        neighbours: how many of the most similar targets are averaged (capped at M).

    Returns:
        (n,) float64.
    """
    sims = unit_rows(candidates) @ unit_rows(targets).T  # (n, M)
    k = min(int(neighbours), sims.shape[1])
    top = -np.sort(-sims, axis=1)[:, :k]  # (n, k) largest first
    return top.mean(axis=1)


def embed_sets(worker: ScoringWorker, target: Any) -> np.ndarray:
    """The embeddings of every sequence of every target set, stacked: (M, H)."""
    parts = []
    for data in target_arrays(target).values():
        ids, n_tokens, _ = sequence_arrays(data)
        parts.append(worker.embed(ids, n_tokens))
    return np.concatenate(parts)


def embed_batches(worker: ScoringWorker, batches: list[Any]) -> np.ndarray:
    """The embeddings of the candidates of ``batches`` (flat, batch by batch): (n, H)."""
    parts = []
    for batch in batches:
        ids, n_tokens, _ = sequence_arrays(batch)
        parts.append(worker.embed(ids, n_tokens))
    return np.concatenate(parts)


class EmbeddedTargets:
    """The target of an embedding scorer (NEAR, TSDS): the embeddings of every target sequence, computed
    once per weights version on the ScoringWorker. Needs a ``targets`` field."""

    targets: Any

    def target_key(self) -> Any:
        return ("embeddings", target_key(self.targets))

    def target(self, worker: ScoringWorker) -> np.ndarray:
        return embed_sets(worker, self.targets)


@dataclass(frozen=True)
class NearScorer(EmbeddedTargets):
    """NEAR on the ScoringWorker (the :class:`~d3ray.schedule.scoring.Scorer` protocol)."""

    neighbours: int
    targets: Any

    def scores(self, worker: ScoringWorker, batches: list[Any], target: np.ndarray) -> np.ndarray:
        return near_scores(embed_batches(worker, batches), target, self.neighbours)


class NearSelectHead(ScorerHead):
    def __init__(self, cfg: Any, ctx: BuildContext) -> None:
        self.target_ref = put_target_sets(ctx, cfg)  # a bad target_sets fails before an actor starts
        super().__init__(cfg, ctx, "near", fixed_model=None if cfg.reference == "current" else cfg.reference)

    def scorer_for(self, chunk: Chunk) -> NearScorer:
        return NearScorer(neighbours=self.cfg.neighbours, targets=self.target_ref)
