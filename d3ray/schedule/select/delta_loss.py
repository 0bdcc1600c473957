"""Delta-Loss: keep a window of the candidates ranked by how much their loss has dropped since a reference
point; the window slides from the most-dropped towards the least-dropped along a sigmoid of progress.

DataFlex's Delta-Loss selector (OpenDCAI/DataFlex, ``DeltaLossSelector``): at its first selection it
stores every training sample's loss ℓ₀; at each later selection it computes the current loss ℓ,
Δ = ℓ₀ − ℓ, ranks the dataset by Δ descending and keeps a window of the ranking of width
w = ``window_size``·N starting at

    start = ⌊σ_k(p)·(N − w)⌋,   σ_k(p) = 1 / (1 + e^(−k·(p − 1/2))),   k = 10,

with p ∈ [0, 1] the selection's position among all selections; the window ends early at the first
negative Δ; it then samples the selection ∝ weight 1 inside the window and 0.025 outside (without
replacement). Early on it trains on what is being learned fastest, late on what is learned least.

The chunk-window analogue here (one candidate window of n = W·B sequences per chunk, never trained
before, so ℓ₀ cannot come from an earlier pass):

- ℓ₀ is each candidate's loss under the *reference* weights: the trainers' initial weights (version 0,
  ``reference: initial``; saved to ``<run_dir>/delta_loss/initial_weights.npz`` when the scheduler first
  sees them, so that a resumed run uses the same ones) or a fixed model directory (``reference: PATH``);
  ℓ is its loss under the weights of version c − staleness; both are scored one chunk ahead on the
  scoring actor. Δ = ℓ₀ − ℓ (non-finite Δ ranks last, as DataFlex's NaN → −inf).
- DataFlex's dataset of N samples is the chunk's window of n candidates; p = chunk_id / total_chunks
  (clipped to [0, 1]); w = ⌈``window_fraction``·n⌉ (default: the kept fraction, so the window is as
  large as what is kept); start and the early end at the first negative Δ as above.
- The kept k = L·B candidates are drawn without replacement ∝ 1 inside the window and
  ``outside_weight`` outside it (DataFlex: 0.025), seeded by (seed, chunk id), by the exponential-key
  method (Efraimidis & Spirakis 2006): key = log(weight) + Gumbel noise, keep the k largest.
  With ``outside_weight: 0`` the window is kept exactly, and if it is shorter than k (the early end)
  the ranks nearest to it fill the rest.
- DataFlex's ℓ₀ is taken at its first selection (after its warm-up steps); here at version 0 (before
  any training) or at a given model: with ``warmup_chunks: 0`` the two coincide.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from d3ray.data.chunker import Chunk
from d3ray.schedule.scheduler import BuildContext, PendingDecision, SubmitContext
from d3ray.schedule.scoring import ScoringWorker, sequence_arrays
from d3ray.schedule.select.target import ScorerHead, rank_scores

INITIAL = "initial"


def sigmoid_window(progress: float, n: int, width: int, steepness: float) -> tuple[int, int]:
    """DataFlex's window [start, start + width) of a ranking of n: start = ⌊σ_k(p)·(n − width)⌋."""
    p = min(max(float(progress), 0.0), 1.0)
    start = int(math.floor(1.0 / (1.0 + math.exp(-steepness * (p - 0.5))) * (n - width)))
    return start, start + width


def delta_loss_scores(delta: np.ndarray, progress: float, width: int, steepness: float, outside_weight: float,
                      rng: np.random.Generator) -> np.ndarray:
    """Scores (n,) whose top k is the Delta-Loss selection of k candidates (see the module docstring).

    Args:
        delta: (n,) Δ = ℓ₀ − ℓ per candidate (non-finite: ranked last).
        progress: p in [0, 1] (clipped).
        width: window width w (1..n).
        steepness: k of the sigmoid (DataFlex: 10).
        outside_weight: sampling weight outside the window, relative to 1 inside (0 = keep the window).
        rng: source of the sampling noise (seeded per chunk).

    Returns:
        (n,) float64 scores (any top-k of them is the rule's selection of k).
    """
    d = np.asarray(delta, dtype=np.float64)
    d = np.where(np.isfinite(d), d, -np.inf)
    n = len(d)
    ranked = np.lexsort((np.arange(n), -d))  # Δ descending, ties: stream order
    start, end = sigmoid_window(progress, n, width, steepness)
    negative = np.flatnonzero(d[ranked] < 0)
    if len(negative):
        end = min(end, int(negative[0]))
    position = np.empty(n, dtype=np.int64)
    position[ranked] = np.arange(n)
    inside = (position >= start) & (position < end)
    if outside_weight > 0:
        keys = np.where(inside, 0.0, math.log(outside_weight)) + rng.gumbel(size=n)
        return keys
    # Window first (in rank order), then by rank distance to the window, then rank.
    distance = np.where(inside, 0, np.where(position < start, start - position, position - end + 1))
    return rank_scores(np.lexsort((position, distance)))


@dataclass(frozen=True)
class DeltaLossScorer:
    """Delta-Loss on the ScoringWorker (the :class:`~d3ray.schedule.scoring.Scorer` protocol)."""

    reference: str
    """A Hugging Face directory or the ``.npz`` of the initial weights."""
    progress: float
    width_fraction: float
    steepness: float
    outside_weight: float
    seed: int
    chunk_id: int

    def target_key(self) -> Any:
        return ("delta_loss", self.reference)

    def target(self, worker: ScoringWorker) -> Any:
        if not os.path.exists(self.reference):
            raise ValueError(f"delta_loss reference {self.reference} does not exist: the initial weights "
                             f"(version 0) were never published to this run's scheduler")
        return worker.reference_model(self.reference)

    def scores(self, worker: ScoringWorker, batches: list[Any], target: Any) -> np.ndarray:
        deltas = []
        for batch in batches:
            ids, _, labels = sequence_arrays(batch)
            deltas.append(worker.sequence_losses(ids, labels, model=target) - worker.sequence_losses(ids, labels))
        delta = np.concatenate(deltas)
        width = min(len(delta), max(1, math.ceil(self.width_fraction * len(delta) - 1e-9)))
        rng = np.random.default_rng([self.seed, self.chunk_id, 104729])
        return delta_loss_scores(delta, self.progress, width, self.steepness, self.outside_weight, rng)


class DeltaLossSelectHead(ScorerHead):
    def __init__(self, cfg: Any, ctx: BuildContext) -> None:
        super().__init__(cfg, ctx, "delta_loss")
        self.total_chunks = max(1, ctx.total_chunks)
        if cfg.reference == INITIAL:
            self.reference = os.path.join(ctx.run_dir, "delta_loss", "initial_weights.npz")
        else:
            self.reference = cfg.reference
        self._saving = False

    def submit(self, chunk: Chunk, batch_refs: tuple, context: SubmitContext) -> PendingDecision:
        if self.cfg.reference == INITIAL and context.weights_version == 0 and not self._saving:
            # Queued on the actor before any scoring call of this or a later chunk (calls run in order).
            self.scorer.save_weights.remote(context.weights, self.reference)
            self._saving = True
        return super().submit(chunk, batch_refs, context)

    def scorer_for(self, chunk: Chunk) -> DeltaLossScorer:
        cfg = self.cfg
        return DeltaLossScorer(
            reference=self.reference, progress=min(1.0, chunk.chunk_id / self.total_chunks),
            width_fraction=cfg.window_fraction if cfg.window_fraction is not None else cfg.fraction,
            steepness=cfg.steepness, outside_weight=cfg.outside_weight, seed=self.seed, chunk_id=chunk.chunk_id)
