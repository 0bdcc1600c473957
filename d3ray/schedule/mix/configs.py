"""Configs of the mix schedulers (registered on import; cheap: no numpy, torch or Ray here).

A mixer decides the domain mixture each chunk is drawn with; its ``order`` field (an order scheduler,
default ``random``) orders the batches of the chunks it drew: ``{type: odm, order: {type: d3}}``.
``domains`` lists the domains mixed (default: every known domain with records in the corpus; SFT: every
task of the training files); the driver resolves and checks them before Ray starts (``domains.py``).
The common base and ``static`` live in ``base_configs.py`` (``prerun.py`` builds its pre-runs from
``static`` without importing this module); they are importable from here as well.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from d3ray.schedule.config import ScheduleConfig
from d3ray.schedule.mix.base_configs import MixScheduleConfig, StaticMixConfig, check_weights
from d3ray.schedule.scheduler import ActorRequest, BuildContext, FeedbackRequest, TrainerRequests

if TYPE_CHECKING:
    from d3ray.schedule.mix.prerun import PreRunContext

__all__ = [
    "DoremiMixConfig",
    "MixScheduleConfig",
    "OdmMixConfig",
    "RandomMixConfig",
    "RegMixConfig",
    "StaticMixConfig",
    "check_weights",
]

@ScheduleConfig.register("random_mix")
@dataclass(frozen=True, kw_only=True)
class RandomMixConfig(MixScheduleConfig):
    """A seeded random mixture per period of ``update_every`` chunks (see ``static.py``). Named
    ``random_mix`` because ``random`` is the random-order baseline (as ``random_select``)."""

    paper = "the random-mixture baseline (DataFlex's random mixer)"

    update_every: int = 1
    """Chunks per mixture period (DataFlex draws anew at every mixing step)."""
    concentration: float = 1.0
    """Dirichlet concentration of each drawn mixture (1: uniform over the simplex)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.update_every < 1:
            raise ValueError(f"schedule.update_every={self.update_every} must be >= 1")
        if not (self.concentration > 0 and math.isfinite(self.concentration)):
            raise ValueError(f"schedule.concentration={self.concentration} must be > 0")

    def build_mixer(self, ctx: BuildContext, domains: list[str]) -> Any:
        from d3ray.schedule.mix.static import RandomMixer

        return RandomMixer(domains, ctx.seed, self.update_every, self.concentration)


@ScheduleConfig.register("odm")
@dataclass(frozen=True, kw_only=True)
class OdmMixConfig(MixScheduleConfig):
    """Online Data Mixing: EXP3 over domains with the training loss as reward (see ``odm.py``)."""

    paper = ("Albalak, Pan, Raffel & Wang 2023, Efficient Online Data Mixing For Language Model Pre-Training "
             "(arXiv 2312.02406), Algorithm 1")

    alpha: float = 0.9
    """Smoothing of the reward estimate per training step, R̂ ← α·R̂ + (1 − α)·r̂ (the paper: 0.9); a chunk's
    update applies it for each of its L steps (α^L)."""
    warmup_chunks: int = 0
    """Chunks drawn uniformly before the bandit starts (their feedback is not used); the exploration
    schedule's t counts the training steps after them (``odm.py``)."""
    reward_scale: float = 1.0
    """Multiplies the reward (the loss); the authors' code divides it by 10."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.alpha < 1.0:
            raise ValueError(f"schedule.alpha={self.alpha} must be in [0, 1)")
        if self.warmup_chunks < 0:
            raise ValueError(f"schedule.warmup_chunks={self.warmup_chunks} must be >= 0")
        if not (self.reward_scale > 0 and math.isfinite(self.reward_scale)):
            raise ValueError(f"schedule.reward_scale={self.reward_scale} must be > 0")

    def own_trainer_requests(self) -> TrainerRequests:
        return TrainerRequests(feedback=FeedbackRequest())

    def build_mixer(self, ctx: BuildContext, domains: list[str]) -> Any:
        from d3ray.schedule.mix.odm import OdmMixer

        return OdmMixer(domains, self.alpha, self.warmup_chunks, self.reward_scale, L=self.L)


@ScheduleConfig.register("doremi")
@dataclass(frozen=True, kw_only=True)
class DoremiMixConfig(MixScheduleConfig):
    """DoReMi: exponentiated-gradient ascent on the excess loss over a reference model (see ``doremi.py``)."""

    paper = ("Xie et al. 2023, DoReMi: Optimizing Data Mixtures Speeds Up Language Model Pretraining "
             "(NeurIPS), Algorithm 1")

    reference: str = ""
    """The reference model: a local Hugging Face model directory, or a d3ray checkpoint (exported once to
    ``<run_dir>/doremi/reference_model``). It must use the run's tokenizer. Empty: ``reference_steps``."""
    reference_steps: int = 0
    """Train the reference first: a run of this many steps of the run's model on ``reference_mixture``
    (its own run directory under ``<run_dir>/doremi/``), before the main run."""
    reference_mixture: dict[str, float] = field(default_factory=dict)
    """The reference run's static mixture; empty = uniform over the mixed domains (the paper)."""
    reference_overrides: list[str] = field(default_factory=list)
    """Dotted overrides of the reference run only (e.g. ``train.lr=1e-3``)."""
    eta: float = 1.0
    """Step size η of the exponentiated-gradient update (the paper: 1)."""
    smoothing: float = 1e-3
    """c: α ← (1 − c)·softmax(log α + η·λ) + c·u (the paper: 1e-3)."""
    scorer_num_cpus: float = 1.0
    """CPUs of the reference-scoring actor."""
    scorer_num_gpus: float = 0.0
    """GPUs of the reference-scoring actor (fractional allowed)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if bool(self.reference) == (self.reference_steps > 0):
            raise ValueError(f"schedule.reference={self.reference!r} / schedule.reference_steps="
                             f"{self.reference_steps}: give exactly one (a model or checkpoint directory, or "
                             f"the steps of a reference run trained first)")
        if self.reference_steps < 0:
            raise ValueError(f"schedule.reference_steps={self.reference_steps} must be >= 0")
        check_weights(self.reference_mixture, "schedule.reference_mixture")
        if not (self.eta > 0 and math.isfinite(self.eta)):
            raise ValueError(f"schedule.eta={self.eta} must be > 0")
        if not 0.0 <= self.smoothing <= 1.0:
            raise ValueError(f"schedule.smoothing={self.smoothing} must be in [0, 1]")

    def own_trainer_requests(self) -> TrainerRequests:
        return TrainerRequests(feedback=FeedbackRequest())

    def own_actor_requests(self) -> list[ActorRequest]:
        return [ActorRequest("doremi_reference", 1, {"CPU": self.scorer_num_cpus, "GPU": self.scorer_num_gpus})]

    def given_weights(self) -> dict[str, float]:
        return dict(self.reference_mixture)

    def before_run(self, ctx: PreRunContext) -> None:
        from d3ray.schedule.mix.prerun import prepare_doremi_reference

        prepare_doremi_reference(self, ctx)

    def reference_dir(self, run_dir: str) -> str:
        from d3ray.schedule.mix.doremi import reference_model_dir
        from d3ray.schedule.mix.prerun import is_hf_model_dir

        if self.reference and is_hf_model_dir(self.reference):
            return self.reference
        path = reference_model_dir(run_dir)
        if not (path / "config.json").is_file():
            raise ValueError(f"schedule.type=doremi: no reference model at {path}; the driver prepares it "
                             f"before the run (DoremiMixConfig.before_run)")
        return str(path)

    def build_mixer(self, ctx: BuildContext, domains: list[str]) -> Any:
        from d3ray.schedule.mix.doremi import DoremiMixer
        from d3ray.schedule.scoring import start_scorer

        scorer = start_scorer(ctx, self.reference_dir(ctx.run_dir), self.scorer_num_cpus, self.scorer_num_gpus,
                              "doremi_reference")
        return DoremiMixer(domains, self.eta, self.smoothing, scorer)


@ScheduleConfig.register("regmix")
@dataclass(frozen=True, kw_only=True)
class RegMixConfig(MixScheduleConfig):
    """RegMix: proxy runs on random mixtures, a regression mixture → validation loss, its predicted-best
    mixture for the main run, static (see ``regmix.py``)."""

    paper = "Liu et al. 2024, RegMix: Data Mixture as Regression for Language Model Pre-training (arXiv 2407.01492)"

    proxy_runs: int = 8
    """N proxy runs (the paper: 512)."""
    proxy_steps: int = 32
    """Steps of each proxy run."""
    proxy_parallel: int = 1
    """Proxy runs at a time (Ray tasks); 1 on a small box, more on a cluster."""
    proxy_num_cpus: float = 0.0
    """CPUs each proxy's Ray task holds (its trainers and data actors ask for their own)."""
    proxy_overrides: list[str] = field(default_factory=list)
    """Dotted overrides of the proxy runs only, e.g. a smaller model (``model.n_layer=1``)."""
    proxy_table: str = ""
    """A ``proxies.csv`` of earlier proxy runs (columns ``mix/<domain>``, ``target``) to fit on instead of
    running proxies (e.g. another run's ``regmix/proxies.csv``)."""
    target: str = "mean"
    """What the regression predicts: ``mean`` (the proxies' ``eval/mean_loss``) or a held-out set name."""
    regressor: str = "ridge"
    """``ridge`` (quadratic ridge; few proxies) or ``lightgbm`` (the paper's; many proxies)."""
    ridge_alpha: float = 1e-4
    """Ridge penalty of ``ridge``."""
    concentration: float = 1.0
    """Dirichlet concentration of the proxy mixtures and of the search."""
    search_samples: int = 100_000
    """Mixtures scored by the regression (the paper: 1M)."""
    top_k: int = 100
    """The chosen mixture is the mean of the top_k predicted (the paper: 100)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("proxy_runs", "proxy_steps", "proxy_parallel", "search_samples", "top_k"):
            if getattr(self, name) < 1:
                raise ValueError(f"schedule.{name}={getattr(self, name)} must be >= 1")
        if not self.proxy_table and self.proxy_runs < 3:
            raise ValueError(f"schedule.proxy_runs={self.proxy_runs} must be >= 3 (a regression on fewer is noise)")
        if self.regressor not in ("ridge", "lightgbm"):
            raise ValueError(f"schedule.regressor={self.regressor!r} must be 'ridge' or 'lightgbm'")
        if self.proxy_num_cpus < 0 or not self.ridge_alpha > 0 or not self.concentration > 0:
            raise ValueError("schedule.proxy_num_cpus must be >= 0, schedule.ridge_alpha and "
                             "schedule.concentration > 0")
        if not self.target:
            raise ValueError("schedule.target must be 'mean' or a held-out set name")

    def before_run(self, ctx: PreRunContext) -> None:
        from d3ray.schedule.mix.prerun import prepare_regmix

        prepare_regmix(self, ctx)

    def build_mixer(self, ctx: BuildContext, domains: list[str]) -> Any:
        from d3ray.data.mixture import validate_mixture
        from d3ray.schedule.mix.regmix import choose_from_table, chosen_mixture, read_proxy_table
        from d3ray.schedule.mix.static import StaticMixer

        mixture = chosen_mixture(ctx.run_dir)
        if mixture is None and self.proxy_table:
            mixture = choose_from_table(self, read_proxy_table(self.proxy_table), domains, ctx.seed, ctx.run_dir)
        if mixture is None:
            raise ValueError(f"schedule.type=regmix: no chosen mixture in {ctx.run_dir}/regmix/mixture.json; the "
                             f"driver runs the proxies first (RegMixConfig.before_run)")
        return StaticMixer(validate_mixture(mixture, domains, "regmix/mixture.json"))
