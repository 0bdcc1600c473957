"""NICE: keep the candidates whose Adam update best aligns with the policy gradient of a reward.

Wang et al. 2025, "NICE: Non-differentiable evaluation metric-based data selection for instruction
tuning" (DataFlex's ``nice`` selector). NICE is LESS (``select/less.py``) with another target side:
where LESS takes the SGD gradient of a target example's reference response, NICE samples responses
from the current model (the policy π_θ), rewards each with the metric, and takes the policy gradient
of the expected reward. For target example x (a held-out SFT prompt with its reference), S responses
y_s ~ π_θ(· | x), rewards r_s = metric(x, y_s) and n_s the tokens of y_s (its EOS included when drawn):

    ψ(x) = P·(1/S)·Σ_s (r_s − b)·∇_θ[−log π_θ(y_s | x)]
         = (1/S)·Σ_s (r_s − b)·n_s·P·∇ℓ̄(x, y_s)             ℓ̄: the token-mean loss of y_s (LESS's ℓ)

with b = 0 (``baseline: none``, the paper) or the mean reward of x's S samples (``baseline: mean``).
P is LESS's JL sketch (linear, so the sum can be taken after sketching; samples with r_s = b cost
nothing: their gradient is never computed). ψ is −P·∇J, the policy gradient with the sign of a loss
gradient, like LESS's target ψ(z') = P·∇ℓ_{z'}: a candidate whose Adam step Γ(z) points along ψ
lowers the loss along the direction that raises the expected reward, J(θ − ηΓ) ≈ J(θ) + η⟨Γ, −∇J⟩.
Candidates keep LESS's features φ(z) = P·Γ(z) and its score (max over target sets of the mean cosine
with the set's examples); the target is computed once per weights version on the scoring actor.

Reward (``reward: exact_match``): :func:`d3ray.data.skills.exact_match`, the evaluation's own rule: a
skill of the generated SFT suite is checked by recomputing the answer from the prompt
(:func:`~d3ray.data.skills.check_answer`); any other task by the normalized reference response.

Sampling (:func:`d3ray.schedule.sampling.sample_responses`): temperature ``temperature`` (0 = greedy),
at most ``max_new_tokens`` (and never past the T of the held-out rows), from the prompt tokens of the
held-out row; seeded per example by (run seed, weights version, set, example index), so a resumed run
and every retry draw the same responses.

Zero feature: an example whose samples all have r_s = b (e.g. no response rewarded, b = 0) has ψ = 0,
no direction. ``zero_reward: skip`` (the paper: reward 0 contributes nothing) leaves it out of its set's
mean, and a set without any rewarded example out of the max; when no example of any set has a
direction, scoring fails and the chunk takes the selectors' fallback (its first batches, recorded with
the reason). ``zero_reward: reference`` uses the example's reference response instead, as a single
sample of reward 1 (LESS's target for that example): useful while the model rewards nothing yet.

Departures from the paper, and why: one checkpoint, the current one (online selection, as LESS here);
DataFlex's reward model (``nice_rm``) and judge are not built: a local reward function exists only for
exact match; the per-example features are unit-normalised before the mean (LESS's cosine), as DataFlex.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from d3ray.config_loading import ConfigError
from d3ray.data.chunker import Chunk
from d3ray.data.labels import lm_labels
from d3ray.schedule.scheduler import BuildContext, SubmitContext
from d3ray.schedule.scoring import ScoringWorker, sequence_arrays
from d3ray.schedule.select.less import LessScorer, LessTarget, target_directions
from d3ray.schedule.select.target import (
    ScorerHead,
    chosen_target_sets,
    put_target_sets,
    target_arrays,
    target_key,
)

logger = logging.getLogger(__name__)

REWARDS = ("exact_match",)
BASELINES = ("none", "mean")
ZERO_REWARD = ("skip", "reference")


def policy_gradient_weights(rewards: np.ndarray, lengths: np.ndarray, baseline: str = "none") -> np.ndarray:
    """w_s = (r_s − b)·n_s / S: the weight of sample s's token-mean loss gradient in ψ (module docstring).

    Args:
        rewards: (S,) r_s.
        lengths: (S,) n_s, the scored tokens of each response (its ``−log π`` is n_s × the token mean).
        baseline: ``none`` (b = 0) or ``mean`` (b = mean of ``rewards``).
    """
    r = np.asarray(rewards, dtype=np.float64)
    n = np.asarray(lengths, dtype=np.float64)
    if r.ndim != 1 or r.shape != n.shape or len(r) == 0:
        raise ValueError(f"rewards {r.shape} and lengths {n.shape} must be the same non-empty 1-D shape")
    if baseline not in BASELINES:
        raise ValueError(f"baseline {baseline!r} must be one of {list(BASELINES)}")
    b = r.mean() if baseline == "mean" else 0.0
    return (r - b) * n / len(r)


def policy_gradient_feature(features: np.ndarray, rewards: np.ndarray, lengths: np.ndarray,
                            baseline: str = "none") -> np.ndarray:
    """ψ = Σ_s w_s·φ_s for the sketched token-mean loss gradients φ_s (S, k) of S sampled responses:
    (k,) float64, zero when every w_s is 0 (see :func:`policy_gradient_weights`)."""
    phi = np.asarray(features, dtype=np.float64)
    w = policy_gradient_weights(rewards, lengths, baseline)
    if phi.ndim != 2 or phi.shape[0] != len(w):
        raise ValueError(f"features {phi.shape} must be (S, k) with S = {len(w)}")
    return w @ phi


def nice_directions(features_by_set: Mapping[str, np.ndarray]) -> tuple[list[str], np.ndarray]:
    """The target directions of the sets that have at least one non-zero example feature.

    Each set's direction is the mean of its non-zero examples' unit features (zero features carry no
    direction and are left out); a set without any is left out of the max.

    Returns:
        (the sets kept, in the given order; (kept, k) directions for :func:`~d3ray.schedule.select.less.less_scores`).

    Raises:
        ValueError: no example of any set has a non-zero feature.
    """
    kept, rows = [], []
    for name, features in features_by_set.items():
        f = np.asarray(features, dtype=np.float64)
        nonzero = f[np.linalg.norm(f, axis=1) > 0]
        if len(nonzero):
            kept.append(name)
            rows.append(nonzero)
    if not kept:
        raise ValueError("nice: no target example has a policy-gradient feature (every sampled response got the "
                         "baseline's reward, e.g. reward 0); set schedule.zero_reward=reference to fall back on the "
                         "reference responses")
    return kept, target_directions(rows)


def example_seed(seed: int, weights_version: int, set_name: str, index: int) -> int:
    """The sampling seed of one target example: a function of (run seed, weights version, set, index)."""
    words = [seed, weights_version, zlib.crc32(set_name.encode("utf-8")), index]
    return int(np.random.SeedSequence(words).generate_state(1, np.uint64)[0] >> np.uint64(1))


def response_rows(prompt: np.ndarray, responses: list[np.ndarray], eos_id: int) -> dict[str, np.ndarray]:
    """Held-out-style rows ``{input_ids, n_tokens, loss_mask}`` of prompt + response, EOS-padded to the
    longest; the loss mask covers the response tokens only (so ℓ̄ is −log π(y | x) / n)."""
    p = len(prompt)
    width = p + max(len(r) for r in responses)
    ids = np.full((len(responses), width), eos_id, dtype=np.int64)
    mask = np.zeros((len(responses), width), dtype=bool)
    for i, response in enumerate(responses):
        ids[i, :p] = prompt
        ids[i, p:p + len(response)] = response
        mask[i, p:p + len(response)] = True
    n_tokens = np.asarray([p + len(r) for r in responses], dtype=np.int64)
    return {"input_ids": ids, "n_tokens": n_tokens, "loss_mask": mask}


@dataclass(frozen=True)
class NiceTarget(LessTarget):
    rewards: dict[str, np.ndarray] | None = None
    """Per set, (n, S) the rewards of the sampled responses (diagnostics and tests)."""
    kept_sets: tuple[str, ...] = ()
    """The sets with at least one non-zero example feature (the rows of ``directions``)."""


@dataclass(frozen=True)
class NiceScorer(LessScorer):
    """NICE's rule on the ScoringWorker: LESS's candidates, a policy-gradient target (module docstring)."""

    tokenizer_dir: str = ""
    seed: int = 0
    weights_version: int = 0
    samples: int = 4
    max_new_tokens: int = 16
    temperature: float = 0.7
    baseline: str = "none"
    zero_reward: str = "skip"
    reward: str = "exact_match"

    def target_key(self) -> Any:
        return ("nice", repr(self.sketch), self.param_filter, target_key(self.targets), self.tokenizer_dir,
                self.seed, self.weights_version, self.samples, self.max_new_tokens, self.temperature,
                self.baseline, self.zero_reward, self.reward)

    def target(self, worker: ScoringWorker) -> NiceTarget:
        from d3ray.data.tokenizer import load_tokenizer

        if self.reward not in REWARDS:
            raise ValueError(f"nice: reward {self.reward!r} is not built; known: {list(REWARDS)}")
        names, moments = self.candidate_setup(worker)
        sketch = self._sketch(worker)
        tokenizer = worker.memo(("tokenizer", self.tokenizer_dir), lambda: load_tokenizer(self.tokenizer_dir))
        features, rewards = {}, {}
        for set_name, data in sorted(target_arrays(self.targets).items()):
            features[set_name], rewards[set_name] = self._set_features(worker, sketch, names, tokenizer, set_name, data)
        all_rewards = np.concatenate([r.ravel() for r in rewards.values()])
        summary = (f"weights version {self.weights_version}: mean reward {float(all_rewards.mean()):.3f} over "
                   f"{len(all_rewards)} sampled responses of {len(rewards)} target sets")
        try:
            kept, directions = nice_directions(features)
        except ValueError as err:
            raise ValueError(f"{err} ({summary})") from None
        logger.info("nice: %s; sets with a direction: %s", summary, ", ".join(kept))
        return NiceTarget(names=names, directions=directions, moments=moments, rewards=rewards,
                          kept_sets=tuple(kept))

    def _set_features(self, worker: ScoringWorker, sketch: Any, names: list[str], tokenizer: Any, set_name: str,
                      data: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """(n, k) ψ of every example of one set, and the (n, S) rewards of its samples."""
        from d3ray.data.skills import exact_match

        eos = int(tokenizer.eos_token_id)
        ids_all = np.asarray(data["input_ids"], dtype=np.int64)
        width = ids_all.shape[1]
        features, rewards = [], []
        for i in range(len(ids_all)):
            mask = np.asarray(data["loss_mask"][i], dtype=bool)
            prompt = ids_all[i, :int(np.argmax(mask))]  # the prompt is where the loss mask is False
            budget = min(self.max_new_tokens, width - len(prompt))
            responses = worker.sample_responses(prompt, self.samples, budget, self.temperature,
                                                example_seed(self.seed, self.weights_version, set_name, i), eos)
            texts = [tokenizer.decode([t for t in r.tolist() if t != eos], skip_special_tokens=True)
                     for r in responses]
            r = np.asarray([float(exact_match(set_name, str(data["prompts"][i]), text, str(data["references"][i])))
                            for text in texts])
            lengths = np.asarray([len(x) for x in responses])
            w = policy_gradient_weights(r, lengths, self.baseline)
            live = np.flatnonzero(w != 0)
            if len(live):
                rows = response_rows(prompt, [responses[s] for s in live], eos)
                ids, _, labels = sequence_arrays(rows)
                live_phi = worker.gradient_features(ids, labels, sketch, names)  # token-mean loss gradients
                phi = np.zeros((len(responses), live_phi.shape[1]))  # the other samples' weights are 0
                phi[live] = live_phi
                feature = policy_gradient_feature(phi, r, lengths, self.baseline)
            elif self.zero_reward == "reference":
                ids = ids_all[i:i + 1]
                labels = lm_labels(ids, np.asarray(data["n_tokens"][i:i + 1]), mask[None])
                feature = worker.gradient_features(ids, labels, sketch, names)[0].astype(np.float64)
            else:
                feature = None
            features.append(feature)
            rewards.append(r)
        k = next((len(f) for f in features if f is not None), 0)
        stacked = np.stack([np.zeros(k) if f is None else f for f in features]) if k else np.zeros((len(features), 1))
        return stacked, np.stack(rewards)


def check_sft_targets(chosen: Mapping[str, Any]) -> None:
    """NICE samples from prompts and rewards against references: every target set must be a held-out
    SFT set that carries them (``prompts``, ``references``); else a ConfigError naming the field."""
    for name, data in chosen.items():
        if not (isinstance(data, Mapping) and "prompts" in data and "references" in data):
            raise ConfigError(
                f"schedule.target_sets: NICE needs held-out SFT records (prompts with reference responses) as its "
                f"target, but {name!r} is a set of plain sequences (pre-training data: data.validation_paths or "
                f"eval.ood_text_paths); fine-tune on SFT records (`d3ray finetune`, or sft: with eval.sft_paths)")


class NiceSelectHead(ScorerHead):
    def __init__(self, cfg: Any, ctx: BuildContext) -> None:
        chosen = chosen_target_sets(ctx, cfg)
        check_sft_targets(chosen)  # pre-training data fails before an actor starts
        if not ctx.tokenizer_dir:
            raise ConfigError("schedule.type=nice: the run has no tokenizer directory to decode sampled responses")
        self.target_ref = put_target_sets(ctx, cfg, chosen)
        super().__init__(cfg, ctx, "nice")
        self.tokenizer_dir = ctx.tokenizer_dir

    def score(self, chunk: Chunk, batch_refs: tuple, context: SubmitContext) -> Any:
        if context.weights is None or context.weights_version is None:
            raise ValueError("no weights snapshot published in time")
        scorer = self.scorer_at(context.weights_version)
        return self.scorer.score.remote(context.weights, list(batch_refs), scorer)

    def scorer_at(self, weights_version: int) -> NiceScorer:
        """The picklable scorer of a weights version (its samples are seeded by it)."""
        c = self.cfg
        return NiceScorer(sketch=c.sketch, param_filter=c.param_filter, targets=self.target_ref,
                          tokenizer_dir=self.tokenizer_dir, seed=self.seed, weights_version=int(weights_version),
                          samples=c.samples, max_new_tokens=c.max_new_tokens, temperature=c.temperature,
                          baseline=c.baseline, zero_reward=c.zero_reward, reward=c.reward)
