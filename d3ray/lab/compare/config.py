"""The comparison config: a base run, a list of arms (dotted overrides), seeds, where to write.

    name: pretrain-tiny
    mode: pretrain                        # pretrain: RunConfig() | finetune: the `d3ray finetune` defaults
    base_config: jobs/configs/tiny.yaml   # optional: a run config file instead of the mode's default
    set: {train.steps: 600}               # optional: dotted overrides of the base, for every arm
    seeds: [0, 1, 2]
    output_dir: runs/compare/pretrain-tiny
    arms:
      - {name: random, set: {schedule.type: random}}
      - {name: d3, set: {schedule.type: d3, schedule.influence.estimator: fisher}}

Every arm × seed is one ``run_pretrain`` run named ``<arm>-s<seed>`` in ``<output_dir>/runs``; the
report goes to ``<output_dir>/report``. See ``d3ray/lab/compare/README.md``.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from d3ray.config import RayClusterConfig
from d3ray.config_loading import ConfigError

ARM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+=-]*$")


@dataclass(frozen=True, kw_only=True)
class ArmConfig:
    """One scheduler configuration of the comparison."""

    name: str
    """Arm name (letters, digits, ``_ . + = -``); its runs are ``<name>-s<seed>``."""
    set: dict[str, Any] = field(default_factory=dict)
    """Dotted RunConfig overrides over the base (``schedule.type: d3``). A mapping value sets the keys
    below its key. Switching a section's ``type`` (``schedule.type: random`` over a D3 base) keeps the
    fields the new type shares with the base's section (``L``, ``shuffle_buffer``, ``staleness`` ...)
    and starts every other field from the new type's defaults."""
    method: bool | None = None
    """True: a method under test, False: a baseline (marked "best baseline" per metric when it leads).
    None: inferred: an arm that orders with D3 (``schedule.type: d3``, or ``schedule.order.type: d3``)
    is a method, every other arm a baseline."""

    label: str = ""
    """What the arm is, in words, printed beside its name in the report (e.g. ``paper-faithful D3: plain
    step, Hutchinson, k = 3500, L = 60``)."""
    control: str | None = None
    """Another arm this one is also paired against, beside the baseline: its own control where it
    differs from the baseline in more than the method (the paper-faithful D3 at L = 60 against random
    order at L = 60: reordering larger windows moves the loss by itself). Holm-adjusted over the arms
    that name a control."""

    def __post_init__(self) -> None:
        if not ARM_NAME.match(self.name or ""):
            raise ValueError(f"arm name {self.name!r} must match {ARM_NAME.pattern} (it names run directories)")


@dataclass(frozen=True, kw_only=True)
class TrunkConfig:
    """A shared trunk: per seed one run of ``arm`` for ``steps`` steps (the LR schedule of the full
    ``train.steps``), whose final checkpoint every arm of that seed starts from (``trunk.py``)."""

    steps: int = 0
    """The branch point (0: no trunk, every arm starts from scratch). A multiple of every arm's
    ``schedule.L``, below ``train.steps``; past the loss plateau."""
    arm: str | None = None
    """The arm whose config trains the trunk (default: the baseline arm, random order)."""


@dataclass(frozen=True, kw_only=True)
class ReportConfig:
    """How each run is read out for the verdicts (``readout.py``)."""

    metric: Literal["final", "last_k_mean", "auc"] = "final"
    """``final``: the last evaluation; ``last_k_mean``: the mean of the last ``k`` evaluations;
    ``auc``: the area under the eval curve over its step span (after the trunk, if any). The
    verdicts use it and also show the final value."""
    k: int = 3
    """Evaluations averaged by ``last_k_mean``."""
    power: float = 0.8
    """The power the "seeds needed" line of each verdict is computed for (two-sided, at 1 − confidence)."""

    def __post_init__(self) -> None:
        if self.metric not in ("final", "last_k_mean", "auc"):
            raise ValueError(f"report.metric={self.metric!r} must be final, last_k_mean or auc")
        if self.k < 1:
            raise ValueError(f"report.k={self.k} must be >= 1")
        if not 0.5 <= self.power < 1.0:
            raise ValueError(f"report.power={self.power} must be in [0.5, 1)")


@dataclass(frozen=True, kw_only=True)
class CompareConfig:
    """A grid of arms × seeds at equal training tokens, and its report."""

    name: str = "compare"
    """Title of the report."""
    mode: Literal["pretrain", "finetune"] = "pretrain"
    """The default base: ``pretrain`` is ``RunConfig()`` (``d3ray pretrain``), ``finetune`` the
    ``d3ray finetune`` defaults (``FINETUNE_DEFAULTS``: the generated skill suite, exact match).
    With ``base_config`` the file is the base, as ``--config`` is for those commands; ``finetune``
    then requires its ``sft:`` section."""
    base_config: str | None = None
    """A run config file (``jobs/configs/*.yaml``) instead of the mode's default."""
    set: dict[str, Any] = field(default_factory=dict)
    """Dotted overrides of the base applied to every arm (before the arm's own)."""
    init_from: str | None = None
    """finetune: a d3ray checkpoint or local Hugging Face directory every run starts from (``--from``)."""
    arms: list[ArmConfig] = field(default_factory=list)
    """The arms; the one named ``baseline`` is what every other arm is compared with."""
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    """Every arm runs once per seed (``seed`` seeds model init, data order and every scheduler);
    arms are compared paired by seed."""
    baseline: str = "random"
    """The reference arm of the relative changes, paired tests and the equal-compute budget."""
    metric: str = "eval/mean_loss"
    """The primary metric (the final evaluation; lower is better unless it is an accuracy or exact match)."""
    output_dir: str = "runs/compare"
    """``runs/<arm>-s<seed>/`` (run directories) and ``report/`` (results.md, results.csv, PNGs)."""
    max_concurrent_runs: int = 1
    """1: one run after another in this process (a small box). N > 1: up to N runs at once, each a
    Ray task holding ``driver_cpus`` (a cluster). 0: N from the cluster's resources and each run's
    needs (``d3ray.tune.trial_resources.trial_resources``)."""
    driver_cpus: float = 1.0
    """CPUs reserved for each run's driver task when runs go in parallel."""
    confidence: float = 0.95
    """Confidence level of the paired intervals."""
    trunk: TrunkConfig = field(default_factory=TrunkConfig)
    """A shared trunk every arm of a seed branches from (``steps: 0``: none)."""
    report: ReportConfig = field(default_factory=ReportConfig)
    """The read-out of each run the verdicts use (final, mean of the last k evaluations, AUC)."""
    aa_arm: str | None = None
    """An A/A arm: the baseline with another order seed (``schedule.order_seed: 1``); its paired sd
    against the baseline is the order noise the report prints."""
    ray: RayClusterConfig = field(default_factory=RayClusterConfig)
    """How this process connects to Ray (every run shares the connection)."""

    def __post_init__(self) -> None:
        if not self.arms:
            raise ValueError("arms: at least one arm is needed (and the baseline arm)")
        names = [a.name for a in self.arms]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"arms: duplicate arm name(s) {duplicates}")
        if self.baseline not in names:
            raise ValueError(f"baseline={self.baseline!r} is not an arm; arms: {names}")
        if not self.seeds:
            raise ValueError("seeds: at least one seed is needed (three or more for a paired test)")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds={self.seeds} has duplicates")
        if self.max_concurrent_runs < 0:
            raise ValueError(f"max_concurrent_runs={self.max_concurrent_runs} must be >= 0")
        if not self.driver_cpus > 0:
            raise ValueError(f"driver_cpus={self.driver_cpus} must be > 0")
        if not 0.5 < self.confidence < 1.0:
            raise ValueError(f"confidence={self.confidence} must be in (0.5, 1)")
        if self.aa_arm is not None and (self.aa_arm not in names or self.aa_arm == self.baseline):
            raise ValueError(f"aa_arm={self.aa_arm!r} must be an arm other than the baseline; arms: {names}")
        for arm in self.arms:
            if arm.control is not None and (arm.control not in names or arm.control == arm.name):
                raise ValueError(f"arm {arm.name!r}: control={arm.control!r} must be another arm; arms: {names}")
        if self.trunk.steps < 0:
            raise ValueError(f"trunk.steps={self.trunk.steps} must be >= 0")
        if self.trunk.arm is not None and self.trunk.arm not in names:
            raise ValueError(f"trunk.arm={self.trunk.arm!r} is not an arm; arms: {names}")
        if self.trunk.steps and self.init_from is not None:
            raise ValueError("trunk: and init_from: exclude each other (the trunk is where every arm starts)")
        if self.init_from is not None and self.mode != "finetune":
            raise ValueError("init_from is for mode: finetune")

    def only_arms(self, names: list[str]) -> CompareConfig:
        """This grid with only the arms ``names`` (``d3ray compare --only-arms``), in the file's order; the A/A arm
        and an arm's control are dropped when they are not among them.

        Raises:
            ConfigError: a name that is no arm, or a subset without the baseline (or the trunk's arm).
        """
        known = [a.name for a in self.arms]
        unknown = [n for n in names if n not in known]
        if unknown:
            raise ConfigError(f"--only-arms: {unknown} not in this file's arms {known}")
        for role, arm in (("baseline", self.baseline), ("trunk.arm", self.trunk.arm)):
            if arm is not None and arm not in names:
                raise ConfigError(f"--only-arms must include the {role} arm {arm!r} (every arm is compared with it)")
        arms = [a if a.control in names else dataclasses.replace(a, control=None) for a in self.arms if a.name in names]
        return dataclasses.replace(self, arms=arms, aa_arm=self.aa_arm if self.aa_arm in names else None)
