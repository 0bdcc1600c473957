"""DoReMi: domain weights by exponentiated-gradient ascent on the excess loss over a reference model.

Xie, Pham, Dong, Du, Liu, Lu, Liang, Le, Ma & Yu 2023, "DoReMi: Optimizing Data Mixtures Speeds Up
Language Model Pretraining" (NeurIPS), Algorithm 1. With K domains, u = 1/K, step size η and smoothing c:

    λ_i  = per-domain excess loss = mean over the domain-i sequences x of the step of max(ℓ_θ(x) − ℓ_ref(x), 0)
    α'   = α · exp(η·λ)                                  (exponentiated-gradient ascent; η = 1 in the paper)
    α    ← (1 − c) · α' / Σ_j α'_j + c·u                 (smoothing; c = 1e-3 in the paper)

i.e. α ← (1 − c)·softmax(log α + η·λ) + c·u, starting from α = u.

Here: ℓ_θ(x) is the training loss the trainers report for every sequence of a chunk (``observe``:
the sequence's token-mean loss in the step that trained it); ℓ_ref(x) is the reference model's loss on
the same sequence, computed ahead of training by a ScoringWorker actor when the chunk is submitted
(one chunk or more before its feedback arrives, never on the trainers' path). One update per chunk.

Departures from the paper, and why:
- The paper's proxy model trains on *uniformly* sampled data with the α-weighted (group-DRO) loss, and
  the average ᾱ over its training is then used as a static mixture for a separate main model. Here α
  is the mixture the stream draws from, online, in the run itself (as the online variants of DoReMi and
  ODM do): one run instead of reference + proxy + main. ᾱ is kept (``average`` in the state and in the
  schedule log as ``doremi_average``) so it can be reused as a ``static`` mixture, the paper's way.
- The clip max(·, 0) is per sequence (of token-mean losses), not per token: the trainers report one
  loss per sequence (``ChunkFeedback``). Sequences are packed to T tokens, so the per-domain mean over
  sequences is the paper's per-token mean up to the clip's granularity.
- A domain with no sequence in the chunk has λ_i = 0 (the paper's empty sum).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from d3ray.data.chunker import Chunk
from d3ray.schedule.mix.base import MixerBase
from d3ray.schedule.scheduler import ChunkFeedback

logger = logging.getLogger(__name__)


def reference_model_dir(run_dir: str | Path) -> Path:
    """``<run_dir>/doremi/reference_model``: the reference exported (or trained and exported) for this run."""
    return Path(run_dir) / "doremi" / "reference_model"


def excess_losses(domains: list[str], sample_domains: tuple[str, ...], losses: np.ndarray,
                  reference: np.ndarray) -> np.ndarray:
    """λ (K,): per-domain mean of max(ℓ_θ − ℓ_ref, 0) over the samples (non-finite pairs left out)."""
    labels = np.asarray(sample_domains, dtype=object)
    excess = np.maximum(np.asarray(losses, dtype=np.float64) - np.asarray(reference, dtype=np.float64), 0.0)
    finite = np.isfinite(excess)
    out = np.zeros(len(domains))
    for i, d in enumerate(domains):
        mine = excess[(labels == d) & finite]
        if len(mine):
            out[i] = float(mine.mean())
    return out


def doremi_update(alpha: np.ndarray, excess: np.ndarray, eta: float, smoothing: float) -> np.ndarray:
    """α ← (1 − c)·softmax(log α + η·λ) + c·u (the module's formula)."""
    alpha = np.asarray(alpha, dtype=np.float64)
    logits = np.log(np.maximum(alpha, 1e-300)) + eta * np.asarray(excess, dtype=np.float64)
    soft = np.exp(logits - logits.max())
    new = (1.0 - smoothing) * soft / soft.sum() + smoothing / len(alpha)
    return new / new.sum()


class DoremiMixer(MixerBase):
    """DoReMi's online domain weights (see the module docstring).

    Args:
        domains: the mixed domains.
        eta: step size η.
        smoothing: c.
        scorer: a ScoringWorker actor holding the reference model (None in pure tests: then
            ``reference_losses`` must be given to :meth:`set_reference`).
    """

    def __init__(self, domains: list[str], eta: float, smoothing: float, scorer: Any = None) -> None:
        self.domains = list(domains)
        self.eta, self.smoothing = eta, smoothing
        self.scorer = scorer
        k = len(self.domains)
        self.alpha = np.full(k, 1.0 / k)
        self.alpha_sum = np.zeros(k)
        self.updates = 0
        self.last_excess = np.zeros(k)
        self._pending: dict[int, tuple[list[str], Any]] = {}  # chunk → (sample ids, ObjectRef of ref losses)
        self._reference: dict[int, dict[str, float]] = {}  # chunk → sample id → reference loss (resolved)

    def decide(self, chunk_id: int) -> dict[str, float]:
        return {d: float(a) for d, a in zip(self.domains, self.alpha, strict=True)}

    def submit(self, chunk: Chunk, batch_refs: tuple) -> None:
        if self.scorer is None or chunk.chunk_id in self._reference:
            return
        ids = [s for batch in chunk.batches for s in batch.sample_ids]
        self._pending[chunk.chunk_id] = (ids, self.scorer.losses.remote(None, list(batch_refs)))

    def set_reference(self, chunk_id: int, reference: dict[str, float]) -> None:
        """The reference losses of a chunk's samples (resolved), by sample id."""
        self._reference[chunk_id] = dict(reference)

    def _reference_of(self, chunk_id: int) -> dict[str, float] | None:
        if chunk_id not in self._reference and chunk_id in self._pending:
            import ray

            ids, ref = self._pending.pop(chunk_id)
            self._reference[chunk_id] = dict(zip(ids, (float(x) for x in ray.get(ref)), strict=True))
        return self._reference.get(chunk_id)

    def observe(self, feedback: ChunkFeedback, mixture: dict[str, float]) -> None:
        from ray.exceptions import RayError

        try:
            reference = self._reference_of(feedback.chunk_id)
        except RayError as err:  # the scoring actor failed beyond its retries: no update for this chunk
            logger.warning("doremi: no reference losses for chunk %d (%s); weights unchanged", feedback.chunk_id,
                           str(err).splitlines()[0][:200])
            return
        if reference is None:
            raise RuntimeError(f"doremi: no reference losses for chunk {feedback.chunk_id} (never submitted)")
        ref = np.asarray([reference.get(s, np.nan) for s in feedback.sample_ids], dtype=np.float64)
        self.last_excess = excess_losses(self.domains, feedback.domains, feedback.losses, ref)
        self.alpha = doremi_update(self.alpha, self.last_excess, self.eta, self.smoothing)
        # not in place: the mixer reaches the coordinator through Ray, whose numpy arrays are read-only
        self.alpha_sum = self.alpha_sum + self.alpha
        self.updates += 1
        self._reference.pop(feedback.chunk_id, None)
        for c in [c for c in self._reference if c < feedback.chunk_id]:
            del self._reference[c]

    def average(self) -> dict[str, float]:
        """ᾱ: the mean of α over the updates so far (the paper's output); uniform before any."""
        mean = self.alpha_sum / self.updates if self.updates else self.alpha
        return {d: float(a) for d, a in zip(self.domains, mean, strict=True)}

    def record(self, chunk_id: int) -> dict[str, Any]:
        return {"doremi_updates": self.updates,
                "doremi_excess": {d: float(x) for d, x in zip(self.domains, self.last_excess, strict=True)},
                "doremi_average": self.average()}

    def state_dict(self) -> dict[str, Any]:
        # The reference losses of chunks submitted but not yet observed travel with the state: a resumed
        # run does not submit the chunks whose decisions its checkpoint holds.
        for c in list(self._pending):
            self._reference_of(c)
        return {"alpha": [float(a) for a in self.alpha], "alpha_sum": [float(a) for a in self.alpha_sum],
                "updates": self.updates, "last_excess": [float(x) for x in self.last_excess],
                "reference": {str(c): r for c, r in sorted(self._reference.items())}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            return
        self.alpha = np.asarray(state["alpha"], dtype=np.float64)
        self.alpha_sum = np.asarray(state["alpha_sum"], dtype=np.float64)
        self.updates = int(state["updates"])
        self.last_excess = np.asarray(state.get("last_excess", np.zeros(len(self.domains))), dtype=np.float64)
        for c, r in state.get("reference", {}).items():
            self._reference.setdefault(int(c), {s: float(x) for s, x in r.items()})

    def actors(self) -> dict[str, list[Any]]:
        return {"doremi_reference": [self.scorer]} if self.scorer is not None else {}

    def close(self) -> None:
        if self.scorer is not None:
            import ray

            ray.kill(self.scorer)
            self.scorer = None
