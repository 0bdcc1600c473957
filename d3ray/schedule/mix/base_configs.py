"""The mixers' common config and the static mixture's (registered on import; cheap: no numpy, torch or Ray).

:class:`MixScheduleConfig` is the base of every mixer's config (``configs.py``); :class:`StaticMixConfig`
is also what ``prerun.py`` builds the pre-runs from (DoReMi's reference run, RegMix's proxies). Both live
here, below ``configs.py`` and ``prerun.py``, so that neither imports the other in a circle
(``configs.py``'s DoReMi and RegMix call ``prerun.py`` before the run). ``configs.py`` re-exports them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from d3ray.schedule.config import ScheduleConfig, StagedScheduleConfig
from d3ray.schedule.scheduler import BuildContext, Kind


def check_weights(weights: dict[str, float], field_name: str) -> None:
    """Weights given in a config: finite, >= 0, summing to 1 within 1e-6 (domains are checked later,
    against the corpus); a ValueError naming ``field_name``."""
    from d3ray.data.mixture import validate_mixture

    if weights:
        validate_mixture(weights, list(weights), field_name)


@dataclass(frozen=True, kw_only=True)
class MixScheduleConfig(StagedScheduleConfig):
    """Common fields of the mixers; ``order`` (from :class:`StagedScheduleConfig`) orders what they drew."""

    kind = Kind.MIX

    domains: list[str] = field(default_factory=list)
    """The domains mixed; empty = every known domain (``data.domains``) that has records in the corpus (SFT:
    every task of ``sft.paths``)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if len(set(self.domains)) != len(self.domains) or not all(self.domains):
            raise ValueError(f"schedule.domains={self.domains} must be distinct non-empty domain names")

    def given_weights(self) -> dict[str, float]:
        """Weights this config fixes (``static``), checked against the corpus' domains by the driver."""
        return {}

    def build(self, ctx: BuildContext):
        from d3ray.schedule.mix.base import MixScheduler

        if not ctx.domains:
            raise ValueError(f"schedule.type={self.type_name}: the build context names no domains to mix "
                             f"(the driver resolves them with d3ray.schedule.mix.domains.resolve_mix_domains)")
        return MixScheduler(self.build_mixer(ctx, list(ctx.domains)), self.order.build_transformed(ctx), self.type_name)

    def build_mixer(self, ctx: BuildContext, domains: list[str]) -> Any:
        raise NotImplementedError


@ScheduleConfig.register("static")
@dataclass(frozen=True, kw_only=True)
class StaticMixConfig(MixScheduleConfig):
    """The same mixture for every chunk (see ``static.py``)."""

    paper = "the static-mixture baseline (DataFlex's static mixer; the main run of RegMix, Liu et al. 2024)"

    weights: dict[str, float] = field(default_factory=dict)
    """domain → weight (>= 0, summing to 1); empty = uniform over ``domains``. Domains left out get 0."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_weights(self.weights, "schedule.weights")

    def given_weights(self) -> dict[str, float]:
        return dict(self.weights)

    def build_mixer(self, ctx: BuildContext, domains: list[str]) -> Any:
        from d3ray.data.mixture import validate_mixture
        from d3ray.schedule.mix.static import StaticMixer

        weights = dict(self.weights) or {d: 1.0 / len(domains) for d in domains}
        return StaticMixer(validate_mixture(weights, domains, "schedule.weights"))
