"""LESS: keep the candidates whose Adam update best aligns with the target sets' gradients.

Xia, Malladi, Gururangan, Arora & Chen 2024, "LESS: Selecting Influential Data for Targeted
Instruction Tuning" (ICML; arXiv 2402.04333), §3.1 (influence under Adam), §3.2 (cosine instead of
inner product, for sequence-length effects) and §4 (gradient features, then the score below).

At the weights θ of version c − staleness, for candidate sequence z (ℓ_z its token-mean loss over its
targets: the response tokens of SFT records) and the trainable parameters matching ``param_filter``
(with ``model.lora`` the trainable ones are the adapters, as in LESS; the regex restricts further):

    g = ∇ℓ_z(θ)
    m' = β1·m + (1 − β1)·g            v' = β2·v + (1 − β2)·g ⊙ g          (the trainers' AdamW state m, v, t)
    m̂ = m' / (1 − β1^(t+1))           v̂ = v' / (1 − β2^(t+1))
    Γ(z) = m̂ / (√v̂ + ε)                                   the paper's Γ: the Adam step z alone would cause
    φ(z) = P·Γ(z)                      P: the JL sketch of d3ray.influence.sketch (seeded, the same on every actor)

For every example z' of target set D_j: ψ(z') = P·∇ℓ_{z'}(θ), the plain (SGD) gradient, as LESS. Then

    score(z) = max_j  (1/|D_j|)·Σ_{z' ∈ D_j} cos(φ(z), ψ(z'))

(a set is LESS's validation subtask; ``mean over a set, max over sets``). The target side is computed
once per weights version and cached on the actor (:meth:`LessScorer.target`).

The preconditioned path switches on by itself when the snapshot carries the optimizer state (a part
with ``exp_avg_sq``: see :class:`AdamMoments`); without one (trainers that do not ship it yet),
Γ(z) = g: the identity preconditioner, i.e. plain gradient features.

Departures from the paper and why:
- One checkpoint, the current one: LESS sums the score over the warm-up checkpoints weighted by their
  mean learning rate; here selection is online, so θ is the newest snapshot (the decision depends only
  on version c − staleness, as the protocol requires).
- Bias correction: Γ above is the paper's (bias-corrected, ε outside the root). LESS's code uses
  m'/√(v' + ε) without bias correction; with no ``step`` in the state, no bias correction is applied
  either (the two differ by per-step scalars only when t is known).
- Without ``exp_avg`` in the state, m = 0: Γ = (1 − β1)/(1 − β1^(t+1))·g / (√v̂ + ε), i.e. the
  second-moment-preconditioned gradient up to a scalar that cosine ignores.
- Without LoRA the features are over full parameters (``param_filter`` keeps the cost down); the
  sketch is d3ray's (sparse JL by default) rather than TRAK's Rademacher projector.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from d3ray.data.chunker import Chunk
from d3ray.schedule.scheduler import BuildContext
from d3ray.schedule.scoring import ScoringWorker, sequence_arrays
from d3ray.schedule.select.target import ScorerHead, put_target_sets, target_arrays, target_key, unit_rows

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AdamMoments:
    """The AdamW state a snapshot carries, by parameter name (the snapshot layout LESS reads).

    A weights snapshot is a list of parts; the optimizer part is any object with these attributes
    (issue 14's ``AdamWState``) or a mapping with these keys:

    - ``exp_avg_sq``: name → v, shaped like the parameter (required; its presence turns LESS's Adam
      features on);
    - ``exp_avg``: name → m (optional; absent = 0);
    - ``step``: updates taken so far, t (optional; absent = no bias correction, as LESS's code);
    - ``betas``: (β1, β2) (optional, default (0.9, 0.999)); ``eps``: ε (optional, default 1e-8).
    """

    exp_avg_sq: Mapping[str, Any]
    exp_avg: Mapping[str, Any] | None = None
    step: int | None = None
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8

    @classmethod
    def from_part(cls, part: Any) -> AdamMoments:
        def get(key: str) -> Any:
            return part.get(key) if isinstance(part, Mapping) else getattr(part, key, None)

        betas = get("betas")
        eps = get("eps")
        step = get("step")
        return cls(exp_avg_sq=get("exp_avg_sq"), exp_avg=get("exp_avg"),
                   step=None if step is None else int(step),
                   betas=(0.9, 0.999) if betas is None else (float(betas[0]), float(betas[1])),
                   eps=1e-8 if eps is None else float(eps))

    def restricted(self, names: Sequence[str]) -> AdamMoments:
        """The state of the parameters ``names`` only, as float32 torch tensors (converted once per version)."""
        import torch

        def tensors(moments: Mapping[str, Any] | None) -> dict[str, Any] | None:
            if moments is None:
                return None
            return {n: torch.tensor(np.asarray(moments[n]), dtype=torch.float32) for n in names}

        return AdamMoments(exp_avg_sq=tensors(self.exp_avg_sq), exp_avg=tensors(self.exp_avg), step=self.step,
                           betas=self.betas, eps=self.eps)

    def check_covers(self, shapes: Mapping[str, tuple[int, ...]]) -> None:
        """Raise ValueError unless v (and m, if given) hold every named parameter with its shape."""
        for label, moments in (("exp_avg_sq", self.exp_avg_sq), ("exp_avg", self.exp_avg)):
            if moments is None:
                continue
            for name, shape in shapes.items():
                if name not in moments:
                    raise ValueError(f"optimizer state {label} lacks parameter {name!r}")
                if tuple(np.shape(moments[name])) != tuple(shape):
                    raise ValueError(f"optimizer state {label}[{name!r}] has shape "
                                     f"{tuple(np.shape(moments[name]))}, the parameter {tuple(shape)}")


def adam_direction(grads: Mapping[str, Any], moments: AdamMoments) -> dict[str, Any]:
    """LESS's Γ = m̂ / (√v̂ + ε) for per-sequence gradients (see the module docstring).

    Args:
        grads: name → (n, *shape) torch tensors, one gradient per sequence.
        moments: the optimizer state (v, optional m and t, β, ε) by name, as torch tensors (or arrays).

    Returns:
        name → (n, *shape): the Adam update direction each sequence alone would cause.
    """
    import torch

    beta1, beta2 = moments.betas
    if moments.step is None:
        c1 = c2 = 1.0
    else:
        c1, c2 = 1.0 - beta1 ** (moments.step + 1), 1.0 - beta2 ** (moments.step + 1)
    out = {}
    for name, g in grads.items():
        v = torch.as_tensor(moments.exp_avg_sq[name], dtype=g.dtype, device=g.device)[None]  # (1, *shape)
        m = (torch.as_tensor(moments.exp_avg[name], dtype=g.dtype, device=g.device)[None]
             if moments.exp_avg is not None else torch.zeros_like(g[:1]))
        m_hat = (beta1 * m + (1.0 - beta1) * g) / c1
        v_hat = (beta2 * v + (1.0 - beta2) * g * g) / c2
        out[name] = m_hat / (v_hat.sqrt() + moments.eps)
    return out


def target_directions(features_by_set: Sequence[np.ndarray]) -> np.ndarray:
    """Per target set, the mean of its examples' unit feature vectors: (S, k).

    ``ĉ · mean_i(t̂_i)`` is the mean cosine of a unit candidate ĉ with the set's examples.
    """
    return np.stack([unit_rows(f).mean(axis=0) for f in features_by_set])


def less_scores(candidates: np.ndarray, directions: np.ndarray) -> np.ndarray:
    """LESS's score: max over target sets of the mean cosine with the set's examples.

    Args:
        candidates: (n, k) candidate features φ(z).
        directions: (S, k) from :func:`target_directions`.

    Returns:
        (n,) float64.
    """
    return (unit_rows(candidates) @ np.asarray(directions, dtype=np.float64).T).max(axis=1)


@dataclass(frozen=True)
class LessTarget:
    names: list[str]
    """The parameters taking part."""
    directions: np.ndarray
    """(S, k) mean unit target features per set."""
    moments: AdamMoments | None
    """The snapshot's optimizer state (None: identity preconditioner)."""


@dataclass(frozen=True)
class LessScorer:
    """LESS's rule on the ScoringWorker (the :class:`~d3ray.schedule.scoring.Scorer` protocol)."""

    sketch: Any
    """The SketchConfig of P."""
    param_filter: str | None
    targets: Any
    """The target sets: [ObjectRef of name → (n, T)], list-wrapped (:func:`~d3ray.schedule.select.target.target_arrays`)."""

    def target_key(self) -> Any:
        return ("less", repr(self.sketch), self.param_filter, target_key(self.targets))

    def _sketch(self, worker: ScoringWorker) -> Any:
        return worker.memo(("sketch", repr(self.sketch)), self.sketch.build)

    def candidate_setup(self, worker: ScoringWorker) -> tuple[list[str], AdamMoments | None]:
        """The parameters taking part, and the snapshot's optimizer state restricted to them (None:
        plain-gradient candidate features)."""
        names = worker.parameter_names(self.param_filter)
        moments = None
        if worker.optimizer_state is not None:
            moments = AdamMoments.from_part(worker.optimizer_state)
            params = dict(worker.model.named_parameters())
            moments.check_covers({n: tuple(params[n].shape) for n in names})
            moments = moments.restricted(names)
        return names, moments

    def target(self, worker: ScoringWorker) -> LessTarget:
        names, moments = self.candidate_setup(worker)
        sketch = self._sketch(worker)
        features = []
        for data in target_arrays(self.targets).values():
            ids, _, labels = sequence_arrays(data)
            features.append(worker.gradient_features(ids, labels, sketch, names))  # SGD gradients, as LESS
        logger.info("less: target features of %d sets over %d parameter tensors; candidate features %s",
                    len(features), len(names), "Adam (snapshot optimizer state)" if moments else "plain gradients")
        return LessTarget(names=names, directions=target_directions(features), moments=moments)

    def scores(self, worker: ScoringWorker, batches: list[Any], target: LessTarget) -> np.ndarray:
        sketch = self._sketch(worker)
        moments = target.moments

        def transform(grads: dict) -> dict:
            return adam_direction(grads, moments) if moments is not None else grads

        out = []
        for batch in batches:
            ids, _, labels = sequence_arrays(batch)
            out.append(worker.gradient_features(ids, labels, sketch, target.names, transform))
        return less_scores(np.concatenate(out), target.directions)


class LessSelectHead(ScorerHead):
    def __init__(self, cfg: Any, ctx: BuildContext) -> None:
        self.target_ref = put_target_sets(ctx, cfg)  # a bad target_sets fails before an actor starts
        super().__init__(cfg, ctx, "less")
        self.param_filter = cfg.param_filter

    def scorer_for(self, chunk: Chunk) -> LessScorer:
        return LessScorer(sketch=self.cfg.sketch, param_filter=self.param_filter, targets=self.target_ref)

