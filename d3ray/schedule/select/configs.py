"""Configs of the select schedulers (registered on import)."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field

from d3ray.influence.config import SjltSketchConfig, SketchConfig
from d3ray.schedule.config import ScheduleConfig, StagedScheduleConfig
from d3ray.schedule.scheduler import ActorRequest, BuildContext, Kind, SnapshotRequest, TrainerRequests


@dataclass(frozen=True, kw_only=True)
class SelectScheduleConfig(StagedScheduleConfig):
    """Common fields of the selectors: keep ``fraction`` of a window of ⌈L / fraction⌉ batches."""

    kind = Kind.SELECT

    fraction: float = 0.5
    """Fraction of the candidate window kept; the window is ⌈L / fraction⌉ batches, L of them train."""
    warmup_chunks: int = 0
    """Chunks before scoring starts; they keep a seeded random subset (DataFlex's warmup_step)."""
    update_every: int = 1
    """Score every this many chunks; the chunks between keep a seeded random subset (DataFlex's update_step)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 < self.fraction <= 1.0:
            raise ValueError(f"schedule.fraction={self.fraction} must be in (0, 1]")
        if self.warmup_chunks < 0:
            raise ValueError(f"schedule.warmup_chunks={self.warmup_chunks} must be >= 0")
        if self.update_every < 1:
            raise ValueError(f"schedule.update_every={self.update_every} must be >= 1")

    def window_batches(self) -> int:
        return math.ceil(self.L / self.fraction - 1e-9)


@ScheduleConfig.register("random_select")
@dataclass(frozen=True, kw_only=True)
class RandomSelectScheduleConfig(SelectScheduleConfig):
    """A seeded uniform random subset of each window (the selection baseline)."""

    paper = "the selection baseline of DataFlex (OpenDCAI/DataFlex) and LESS (Xia et al. 2024)"

    def build_head(self, ctx: BuildContext):
        from d3ray.schedule.select.base import RandomSelectHead

        return RandomSelectHead(self, ctx.seed, "random_select")


@dataclass(frozen=True, kw_only=True)
class ScorerSelectScheduleConfig(SelectScheduleConfig):
    """A selector that scores candidates with a model on a scoring actor."""

    scorer_num_cpus: float = 1.0
    """CPUs of the scoring actor."""
    scorer_num_gpus: float = 0.0
    """GPUs of the scoring actor (fractional allowed)."""

    def own_trainer_requests(self) -> TrainerRequests:
        return TrainerRequests(snapshot=SnapshotRequest())

    def own_actor_requests(self) -> list[ActorRequest]:
        return [ActorRequest("scorer", 1, {"CPU": self.scorer_num_cpus, "GPU": self.scorer_num_gpus})]


@ScheduleConfig.register("loss")
@dataclass(frozen=True, kw_only=True)
class LossSelectScheduleConfig(ScorerSelectScheduleConfig):
    """Keep the candidates of highest current loss (DataFlex's Loss selector; online batch selection
    by loss, Loshchilov & Hutter 2015), scored one chunk ahead at the weights of version c − staleness."""

    paper = "Loshchilov & Hutter 2015, Online Batch Selection for Faster Training of Neural Networks; DataFlex Loss"

    def build_head(self, ctx: BuildContext):
        from d3ray.schedule.select.loss import LossSelectHead

        return LossSelectHead(self, ctx)


def check_reference(reference: str, special: str) -> None:
    """``reference`` is ``special`` or an existing directory; else a ValueError naming the field."""
    if reference != special and not os.path.isdir(reference):
        raise ValueError(f"schedule.reference={reference!r} must be {special!r} or an existing local "
                         f"Hugging Face model directory")


@dataclass(frozen=True, kw_only=True)
class TargetSelectScheduleConfig(ScorerSelectScheduleConfig):
    """A selector that selects towards target sets: the run's held-out sets (``BuildContext.eval_sets``)."""

    target_sets: list[str] = field(default_factory=list)
    """Held-out sets that form the target, by name (the domain names of ``data.validation_paths``, and
    ``ood:<file stem>`` for each ``eval.ood_text_paths`` file: that is how a target *file* is given).
    Empty = every in-domain set. Checked against the run's sets when the scheduler is built."""
    max_target_sequences: int = 32
    """The first this many sequences of each target set are used."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_target_sequences < 1:
            raise ValueError(f"schedule.max_target_sequences={self.max_target_sequences} must be >= 1")
        if len(set(self.target_sets)) != len(self.target_sets) or not all(self.target_sets):
            raise ValueError(f"schedule.target_sets={self.target_sets} must be distinct non-empty names")


@ScheduleConfig.register("less")
@dataclass(frozen=True, kw_only=True)
class LessSelectScheduleConfig(TargetSelectScheduleConfig):
    """LESS: keep the candidates whose Adam update direction (sketched per-sequence gradient,
    preconditioned by the trainers' AdamW second moments when the snapshot carries them) has the
    highest mean cosine with a target set's gradients (max over sets). See ``select/less.py``."""

    paper = "Xia et al. 2024, LESS: Selecting Influential Data for Targeted Instruction Tuning (ICML)"

    sketch: SketchConfig = field(default_factory=SjltSketchConfig)
    """JL map P of the gradient features (``type: sjlt | gaussian | identity``; LESS: k = 8192)."""
    param_filter: str | None = None
    """Regex (``re.search``) on the names of the trainable parameters whose gradients form the features;
    None = all trainable ones (with ``model.lora``: the adapters, as LESS). Per-sequence gradients cost
    memory micro_batch · d: restrict it on big models without LoRA."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.param_filter is not None:
            try:
                re.compile(self.param_filter)
            except re.error as err:
                raise ValueError(f"schedule.param_filter={self.param_filter!r} is not a valid regex ({err})") from None

    def build_head(self, ctx: BuildContext):
        from d3ray.schedule.select.less import LessSelectHead

        return LessSelectHead(self, ctx)


@ScheduleConfig.register("nice")
@dataclass(frozen=True, kw_only=True)
class NiceSelectScheduleConfig(LessSelectScheduleConfig):
    """NICE: LESS towards a non-differentiable metric: keep the candidates whose Adam update direction best
    aligns with the policy gradient of the reward (exact match) of responses sampled from the current model
    for the held-out SFT prompts. See ``select/nice.py``."""

    paper = ("Wang et al. 2025, NICE: Non-differentiable evaluation metric-based data selection for instruction "
             "tuning; DataFlex nice")

    max_target_sequences: int = 8
    """The first this many prompts of each target set are sampled from (S responses each)."""
    samples: int = 4
    """S: responses sampled per target prompt (DataFlex's mc_samples: 4)."""
    max_new_tokens: int = 16
    """At most this many tokens per sampled response (and never past the held-out rows' T)."""
    temperature: float = 0.7
    """Sampling temperature (DataFlex: 0.7); 0 = greedy (the S responses are then identical)."""
    reward: str = "exact_match"
    """The metric: ``exact_match`` (the SFT suite's recomputing checker for its skills, the normalized
    reference response for other tasks: the evaluation's rule). No reward model is built."""
    baseline: str = "none"
    """``none`` (the paper: Σ r_s·∇log π) or ``mean`` (r_s − the mean reward of the prompt's samples)."""
    zero_reward: str = "skip"
    """A prompt whose samples all score the baseline has no policy-gradient direction: ``skip`` it (no
    prompt of any set rewarded: the chunk falls back to its first batches), or use its ``reference``
    response as one rewarded sample (LESS's target for that prompt)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        from d3ray.schedule.select.nice import BASELINES, REWARDS, ZERO_REWARD

        if self.samples < 1:
            raise ValueError(f"schedule.samples={self.samples} must be >= 1")
        if self.max_new_tokens < 1:
            raise ValueError(f"schedule.max_new_tokens={self.max_new_tokens} must be >= 1")
        if not self.temperature >= 0:
            raise ValueError(f"schedule.temperature={self.temperature} must be >= 0 (0 = greedy)")
        if self.reward not in REWARDS:
            raise ValueError(f"schedule.reward={self.reward!r} is not built; known: {list(REWARDS)} (a reward model, "
                             f"DataFlex's nice_rm, would need a local reward-model directory)")
        if self.baseline not in BASELINES:
            raise ValueError(f"schedule.baseline={self.baseline!r} must be one of {list(BASELINES)}")
        if self.baseline == "mean" and self.samples < 2:
            raise ValueError(f"schedule.baseline=mean needs schedule.samples >= 2 (got {self.samples}): with one "
                             f"sample every feature is zero")
        if self.zero_reward not in ZERO_REWARD:
            raise ValueError(f"schedule.zero_reward={self.zero_reward!r} must be one of {list(ZERO_REWARD)}")

    def build_head(self, ctx: BuildContext):
        from d3ray.schedule.select.nice import NiceSelectHead

        return NiceSelectHead(self, ctx)


@ScheduleConfig.register("delta_loss")
@dataclass(frozen=True, kw_only=True)
class DeltaLossSelectScheduleConfig(ScorerSelectScheduleConfig):
    """Delta-Loss: rank the window by Δ = loss under the reference weights − current loss and keep a
    window of the ranking that slides from the largest Δ to the smallest along a sigmoid of training
    progress (DataFlex's Delta-Loss on candidate windows; see ``select/delta_loss.py``)."""

    paper = "DataFlex Delta-Loss selector (OpenDCAI/DataFlex)"

    reference: str = "initial"
    """``initial`` (the trainers' weights before training, version 0) or a local Hugging Face model
    directory whose losses are the reference."""
    window_fraction: float | None = None
    """Width of the sliding window, as a fraction of the candidates (DataFlex's window_size); None =
    ``fraction`` (the window is as large as what is kept)."""
    steepness: float = 10.0
    """k of the window's sigmoid σ(k·(progress − 1/2)) (DataFlex: 10)."""
    outside_weight: float = 0.025
    """Sampling weight of a candidate outside the window relative to one inside (DataFlex: 0.025);
    0 = keep exactly the window."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_reference(self.reference, "initial")
        if self.window_fraction is not None and not 0.0 < self.window_fraction <= 1.0:
            raise ValueError(f"schedule.window_fraction={self.window_fraction} must be in (0, 1]")
        if not self.steepness > 0:
            raise ValueError(f"schedule.steepness={self.steepness} must be > 0")
        if not 0.0 <= self.outside_weight <= 1.0:
            raise ValueError(f"schedule.outside_weight={self.outside_weight} must be in [0, 1]")

    def build_head(self, ctx: BuildContext):
        from d3ray.schedule.select.delta_loss import DeltaLossSelectHead

        return DeltaLossSelectHead(self, ctx)


@dataclass(frozen=True, kw_only=True)
class EmbeddingSelectScheduleConfig(TargetSelectScheduleConfig):
    """A selector over embeddings (mean-pooled last hidden states) of candidates and target."""

    reference: str = "current"
    """``current`` (the trainers' weights of version c − staleness) or a local Hugging Face model
    directory that embeds (fixed: no weights snapshots, the target embedded once)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_reference(self.reference, "current")

    def own_trainer_requests(self) -> TrainerRequests:
        return TrainerRequests(snapshot=SnapshotRequest() if self.reference == "current" else None)


@ScheduleConfig.register("tsds")
@dataclass(frozen=True, kw_only=True)
class TsdsSelectScheduleConfig(EmbeddingSelectScheduleConfig):
    """TSDS: selection probabilities from optimal transport of the target embeddings onto the window's
    candidates with a kernel-density diversity regulariser (KNN-KDE), then a draw of the kept ones.
    See ``select/tsds.py``."""

    paper = "Liu, Karbasi & Rekatsinas 2024, TSDS: Data Selection for Task-Specific Model Finetuning (NeurIPS)"

    alpha: float = 0.5
    """Trade-off in [0, 1]: 1 = pure distribution alignment (nearest neighbours), 0 = most diverse."""
    C: float = 1.0
    """Scale of the transport cost; embeddings are unit-norm, so about 1 (the paper: the embeddings' norm)."""
    sigma: float = 0.75
    """KDE kernel width on unit embeddings (0 = no near-duplicate correction; the authors' default 0.75)."""
    knn: int = 64
    """Nearest candidates each target may send mass to (capped at the window)."""
    keep: str = "sample"
    """``sample``: a seeded draw without replacement ∝ the probabilities; ``top``: the most probable."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"schedule.alpha={self.alpha} must be in [0, 1]")
        if not self.C > 0:
            raise ValueError(f"schedule.C={self.C} must be > 0")
        if not self.sigma >= 0:
            raise ValueError(f"schedule.sigma={self.sigma} must be >= 0")
        if self.knn < 1:
            raise ValueError(f"schedule.knn={self.knn} must be >= 1")
        if self.keep not in ("sample", "top"):
            raise ValueError(f"schedule.keep={self.keep!r} must be 'sample' or 'top'")

    def build_head(self, ctx: BuildContext):
        from d3ray.schedule.select.tsds import TsdsSelectHead

        return TsdsSelectHead(self, ctx)


@ScheduleConfig.register("near")
@dataclass(frozen=True, kw_only=True)
class NearSelectScheduleConfig(EmbeddingSelectScheduleConfig):
    """NEAR: keep the candidates most similar (cosine of embeddings, mean over the ``neighbours``
    nearest target examples) to the target (DataFlex's nearest-neighbour selector). See ``select/near.py``."""

    paper = "DataFlex NEAR selector (OpenDCAI/DataFlex): nearest neighbours of the target in embedding space"

    neighbours: int = 1
    """Most similar target examples averaged per candidate (1 = the nearest)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.neighbours < 1:
            raise ValueError(f"schedule.neighbours={self.neighbours} must be >= 1")

    def build_head(self, ctx: BuildContext):
        from d3ray.schedule.select.near import NearSelectHead

        return NearSelectHead(self, ctx)
