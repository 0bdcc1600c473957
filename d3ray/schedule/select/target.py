"""What the model-scored selectors share: the target sets, and a head whose scores come from a Scorer.

    BuildContext.eval_sets (the run's held-out sets: name → (n, T) int32, or an SFT task's
    {input_ids, n_tokens, loss_mask})
        │ choose_target_sets(schedule.target_sets, schedule.max_target_sequences)
        │   default: every in-domain set (names without ``ood:``); a target *file* is an
        │   ``eval.ood_text_paths`` entry, named ``ood:<file stem>`` in ``target_sets``
        ▼
    one ObjectRef of the chosen sets, put once by the head, handed to every scoring call
        ▼
    ScorerHead.score(chunk) ──► ScoringWorker.score(weights, candidates, Scorer) ──► (n,) scores
                                 (the Scorer's target is computed once per weights version there)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from d3ray.config_loading import ConfigError
from d3ray.data.chunker import Chunk
from d3ray.ray_refs import ref_key, resolve
from d3ray.schedule.scheduler import BuildContext, SubmitContext
from d3ray.schedule.select.base import SelectHead

OOD_PREFIX = "ood:"


def choose_target_sets(available: Mapping[str, np.ndarray], requested: Sequence[str],
                       max_sequences: int) -> dict[str, np.ndarray]:
    """The target sets of a selector: ``requested`` names, or every in-domain set when none are named.

    Args:
        available: the run's held-out sets, name → (n, T) token ids (pre-training) or
            ``{input_ids, n_tokens, loss_mask}`` (SFT: per task, responses as the loss targets).
        requested: ``schedule.target_sets`` (empty = all sets whose name does not start with ``ood:``).
        max_sequences: the first this many sequences of each set are kept.

    Raises:
        ConfigError: no held-out sets, an unknown name, or a chosen set without sequences; the message
            names ``schedule.target_sets``.
    """
    known = ", ".join(sorted(available)) or "(none)"
    if not available:
        raise ConfigError("schedule.target_sets: the run has no held-out sets to select towards; set "
                          "data.validation_paths (per-domain sets) or eval.ood_text_paths (a target file, "
                          "named ood:<file stem>)")
    names = list(requested) or sorted(n for n in available if not n.startswith(OOD_PREFIX))
    if not names:
        raise ConfigError(f"schedule.target_sets: the run has no in-domain held-out set; name one of: {known}")
    for name in names:
        if name not in available:
            raise ConfigError(f"schedule.target_sets: unknown held-out set {name!r}; known: {known}")
        if len(_rows(available[name], None)["input_ids"]) == 0:
            raise ConfigError(f"schedule.target_sets: held-out set {name!r} has no sequences")
    return {name: _first(available[name], max_sequences) for name in names}


def _rows(data: Any, count: int | None) -> dict[str, Any]:
    """A held-out set as ``{input_ids, ...}``: (n, T) full sequences, or an SFT set's dict."""
    fields = dict(data) if isinstance(data, Mapping) else {"input_ids": np.asarray(data)}
    return {k: (None if v is None else np.asarray(v)[:count]) for k, v in fields.items()}


def _first(data: Any, count: int) -> Any:
    """The first ``count`` sequences of a held-out set, in its own form."""
    return _rows(data, count) if isinstance(data, Mapping) else np.asarray(data)[:count]


def chosen_target_sets(ctx: BuildContext, cfg: Any) -> dict[str, Any]:
    """The run's held-out sets chosen by ``cfg.target_sets`` and capped at ``cfg.max_target_sequences``
    (see :func:`choose_target_sets`); ``ctx.eval_sets`` is ``[ObjectRef]``, list-wrapped (``d3ray.ray_refs.resolve``)."""
    available = target_arrays(ctx.eval_sets) if ctx.eval_sets else {}
    return choose_target_sets(available, cfg.target_sets, cfg.max_target_sequences)


def put_target_sets(ctx: BuildContext, cfg: Any, chosen: dict[str, Any] | None = None) -> list:
    """The chosen target sets (:func:`chosen_target_sets`, unless given) put in the object store once:
    ``[ObjectRef]``, list-wrapped so that Ray hands the ref, not the dict, to the actor."""
    import ray

    return [ray.put(chosen_target_sets(ctx, cfg) if chosen is None else chosen)]


class ScorerHead(SelectHead):
    """A selector whose candidates are scored by a :class:`~d3ray.schedule.scoring.Scorer` on a
    ScoringWorker actor, one chunk ahead.

    Args:
        cfg: the selector's config (``scorer_num_cpus``, ``scorer_num_gpus`` and the select fields).
        ctx: the run's build context.
        name: scheduler name (schedule log, actor name).
        fixed_model: a Hugging Face directory the actor scores with (no weights snapshots), or None
            to score at the trainers' weights of version c − staleness.
    """

    def __init__(self, cfg: Any, ctx: BuildContext, name: str, fixed_model: str | None = None) -> None:
        from d3ray.schedule.scoring import start_scorer

        super().__init__(cfg, ctx.seed, name)
        self.needs_weights = fixed_model is None
        self.scorer = start_scorer(ctx, fixed_model, cfg.scorer_num_cpus, cfg.scorer_num_gpus, f"{name}-scorer")

    def score(self, chunk: Chunk, batch_refs: tuple, context: SubmitContext) -> Any:
        if self.needs_weights and context.weights is None:
            raise ValueError("no weights snapshot published in time")
        weights = context.weights if self.needs_weights else None
        return self.scorer.score.remote(weights, list(batch_refs), self.scorer_for(chunk))

    def scorer_for(self, chunk: Chunk) -> Any:
        """The picklable Scorer of this chunk."""
        raise NotImplementedError

    def actors(self) -> dict[str, list[Any]]:
        return {"scorer": [self.scorer]}

    def close(self) -> None:
        import ray

        ray.kill(self.scorer)


def target_arrays(target: Any) -> dict[str, np.ndarray]:
    """The target sets (name → (n, T)) of ``[ref]``, the list-wrapped ObjectRef a head puts once (``resolve``d here)."""
    (ref,) = target
    return dict(resolve(ref))


def target_key(target: Any) -> Any:
    """A hashable identity of the target sets ``[ref]`` (``d3ray.ray_refs.ref_key`` of the ref)."""
    (ref,) = target
    return ref_key(ref)


def unit_rows(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm (zero rows stay zero): (n, d) float64."""
    x = np.asarray(x, dtype=np.float64)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, 1e-12)


def rank_scores(order: np.ndarray) -> np.ndarray:
    """Scores whose descending sort is ``order`` (a permutation of the candidates): n − position."""
    scores = np.empty(len(order), dtype=np.float64)
    scores[np.asarray(order, dtype=np.int64)] = np.arange(len(order), 0, -1, dtype=np.float64)
    return scores
