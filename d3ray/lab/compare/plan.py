"""The grid of a comparison: one RunConfig per arm × seed, checked for equal training tokens.

    base RunConfig (mode default or base_config) + top-level set ──► base dict (paths absolute,
        │                                                            shared tokenizer path)
        ▼ per arm: type switches (keep the shared fields), then the arm's dotted overrides
    arm RunConfig ──► equal-token check against the base (names the arm and the key)
        ▼ per seed: seed, name ``<arm>-s<seed>``, output_dir ``<output_dir>/runs``
    RunSpec(arm, seed, config | error)

No Ray here: a plan is built (and every error found) before anything starts. An arm whose
overrides do not build a RunConfig (an unknown key, a bad value) becomes failed runs carrying the
error, so the other arms still run; an arm that changes the token budget is an error of the whole
comparison (its numbers would not be comparable).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from d3ray.config import RunConfig, absolute_paths
from d3ray.config_loading import ConfigError, apply_overrides, flatten_dotted, from_dict, load_config, to_dict
from d3ray.lab.compare.config import ArmConfig, CompareConfig
from d3ray.lab.compare.trunk import BRANCH_DIR, same_stream
from d3ray.lab.schedule_questions import orders_by_influence
from d3ray.registry import ChoiceConfig

#: What fixes the training tokens of a run (and makes losses comparable, nats per token of one
#: tokenizer): no arm may change them. ``schedule.L`` may differ (it only groups batches).
EQUAL_TOKEN_KEYS = (
    "train.steps",
    "train.global_batch_size",
    "data.seq_len",
    "data.tokenizer",
    "sft.seq_len",
    "sft.batching",
)
#: Set per run by the comparison; an arm cannot set them.
RUN_KEYS = ("name", "seed", "output_dir", "storage_path")
#: Set per run by the comparison's trunk (``trunk:``); an arm cannot set them.
TRUNK_KEYS = ("train.stop_at_step", "train.init_checkpoint")


@dataclass(frozen=True)
class RunSpec:
    """One run of the grid: its config, or the error that kept it from being built."""

    arm: str
    seed: int
    name: str
    run_dir: Path
    config: RunConfig | None
    error: str | None = None


@dataclass(frozen=True)
class ComparePlan:
    """Every run of the grid (arm-major, in config order), the base and where things go."""

    compare: CompareConfig
    base: RunConfig
    runs: list[RunSpec]
    methods: dict[str, bool]
    """Arm → is it a method under test (else a baseline)."""
    shared_tokenizer: Path | None
    """``<output_dir>/tokenizer``: trained once for every run (pre-training on files), else None."""
    trunks: dict[int, RunSpec] = dataclasses.field(default_factory=dict)
    """Seed → its shared trunk run (``trunk:``; ``<output_dir>/trunks/trunk-s<seed>``); empty without."""
    same_stream: dict[str, bool] = dataclasses.field(default_factory=dict)
    """Arm → whether it reads the trunk's chunk stream (then it keeps the trunk's data cursor)."""

    @property
    def trunk_steps(self) -> int:
        """The branch point (0 without a trunk): the report reads the evaluations after it."""
        return self.compare.trunk.steps

    @property
    def output_dir(self) -> Path:
        return Path(self.compare.output_dir).expanduser().resolve()

    @property
    def report_dir(self) -> Path:
        return self.output_dir / "report"

    @property
    def arms(self) -> list[str]:
        return [a.name for a in self.compare.arms]


def base_run_config(cfg: CompareConfig) -> RunConfig:
    """The base RunConfig: the mode's default (or ``base_config``) plus the top-level ``set``."""
    from d3ray.run.defaults import FINETUNE_DEFAULTS

    defaults = FINETUNE_DEFAULTS if cfg.mode == "finetune" and cfg.base_config is None else []
    base = load_config(RunConfig, cfg.base_config, defaults)
    data = _with_overrides(to_dict(base), cfg.set, "set")
    base = from_dict(RunConfig, data)
    if cfg.mode == "finetune" and base.sft is None:
        raise ConfigError(f"{cfg.base_config}: mode: finetune needs a base config with an `sft:` section")
    if cfg.mode == "pretrain" and base.sft is not None:
        raise ConfigError(f"{cfg.base_config}: the base config fine-tunes (`sft:`); set mode: finetune")
    return base


def build_plan(cfg: CompareConfig) -> ComparePlan:
    """Every run of the grid, built and checked (no Ray, no training).

    Raises:
        ConfigError: a bad base config, an arm that sets a per-run key (name, seed, ...), or an arm
            that changes the training tokens (:data:`EQUAL_TOKEN_KEYS`), naming the arm and the key.
    """
    output_dir = Path(cfg.output_dir).expanduser().resolve()
    base_cfg = base_run_config(cfg)
    base = absolute_paths(base_cfg)
    shared_tokenizer = None
    if cfg.mode == "pretrain" and base["data"]["train_paths"] and not base["data"]["tokenizer"]["path"]:
        shared_tokenizer = output_dir / "tokenizer"
        base["data"]["tokenizer"]["path"] = str(shared_tokenizer)
    base_cfg = from_dict(RunConfig, base)
    runs: list[RunSpec] = []
    methods: dict[str, bool] = {}
    arm_cfgs: dict[str, RunConfig | None] = {}
    for arm in cfg.arms:
        arm_cfg, error = _arm_config(base, arm)
        if arm_cfg is not None:
            check_equal_tokens(base_cfg, arm_cfg, arm.name)
        arm_cfgs[arm.name] = arm_cfg
        methods[arm.name] = arm.method if arm.method is not None else (arm_cfg is not None and orders_by_influence(arm_cfg.schedule))
        for seed in cfg.seeds:
            name = f"{arm.name}-s{seed}"
            config = None
            if arm_cfg is not None:
                config = dataclasses.replace(arm_cfg, seed=seed, name=name, output_dir=str(output_dir / "runs"))
            runs.append(RunSpec(arm.name, seed, name, output_dir / "runs" / name, config, error))
    if not cfg.trunk.steps:
        return ComparePlan(cfg, base_cfg, runs, methods, shared_tokenizer)
    trunk_cfg = _trunk_config(cfg, base_cfg, arm_cfgs)
    trunks = {seed: RunSpec("trunk", seed, f"trunk-s{seed}", output_dir / "trunks" / f"trunk-s{seed}",
                            dataclasses.replace(trunk_cfg, seed=seed, name=f"trunk-s{seed}",
                                                output_dir=str(output_dir / "trunks")))
              for seed in cfg.seeds}
    same = {a: c is not None and same_stream(trunk_cfg, c) for a, c in arm_cfgs.items()}
    runs = [r if r.config is None else dataclasses.replace(r, config=_branched(r.config, r.run_dir / BRANCH_DIR))
            for r in runs]
    return ComparePlan(cfg, base_cfg, runs, methods, shared_tokenizer, trunks, same)


def _trunk_config(cfg: CompareConfig, base: RunConfig, arm_cfgs: dict[str, RunConfig | None]) -> RunConfig:
    """The trunk's RunConfig: the trunk arm's, stopped at ``trunk.steps`` (its LR schedule is that of
    ``train.steps``), checked against every arm's chunk length.

    Raises:
        ConfigError: naming ``trunk.steps`` or ``trunk.arm``.
    """
    steps, name = cfg.trunk.steps, cfg.trunk.arm or cfg.baseline
    if not 0 < steps < base.train.steps:
        raise ConfigError(f"trunk.steps={steps} must be in (0, train.steps={base.train.steps})")
    trunk = arm_cfgs[name]
    if trunk is None:
        raise ConfigError(f"trunk.arm={name!r}: that arm's config cannot be built, so the trunk cannot")
    for arm, c in [("trunk", trunk), *arm_cfgs.items()]:
        if c is not None and steps % c.schedule.L:
            raise ConfigError(f"trunk.steps={steps} must be a multiple of schedule.L={c.schedule.L} (arm {arm!r}): "
                              "every arm branches at a chunk boundary")
    return dataclasses.replace(trunk, train=dataclasses.replace(trunk.train, stop_at_step=steps))


def _branched(cfg: RunConfig, checkpoint: Path) -> RunConfig:
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, init_checkpoint=str(checkpoint)))


def _arm_config(base: dict[str, Any], arm: ArmConfig) -> tuple[RunConfig | None, str | None]:
    """The arm's RunConfig, or None and the error (a ConfigError's message) that prevents it."""
    flat = dict(flatten_dotted(arm.set))
    for key in flat:
        if key.split(".")[0] in RUN_KEYS:
            raise ConfigError(f"arm {arm.name!r}: {key!r} is set per run by the comparison; an arm cannot set it")
        if key in TRUNK_KEYS:
            raise ConfigError(f"arm {arm.name!r}: {key!r} is set by the comparison's trunk; an arm cannot set it")
    try:
        return from_dict(RunConfig, _with_overrides(base, arm.set, f"arm {arm.name!r}")), None
    except ConfigError as err:
        message = str(err) if str(err).startswith("arm ") else f"arm {arm.name!r}: {err}"
        return None, message


def _with_overrides(base: dict[str, Any], overrides: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``base`` with dotted ``overrides``; a ``<section>.type`` that switches type resets the section
    to the fields the new type shares with it (see :func:`switch_type`)."""
    flat = flatten_dotted(overrides)
    data = to_dict(base)
    for key, value in sorted((kv for kv in flat if kv[0].endswith(".type")), key=lambda kv: kv[0].count(".")):
        data = switch_type(data, key.removesuffix(".type").split("."), value, where)
    try:
        return apply_overrides(data, [f"{key}={_yaml_value(value)}" for key, value in flat])
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None


def _yaml_value(value: Any) -> str:
    import json

    return json.dumps(value)  # JSON is YAML: the value round-trips through apply_overrides unchanged


def switch_type(data: dict[str, Any], section: list[str], new_type: Any, where: str) -> dict[str, Any]:
    """``data`` with the registered-choice section at ``section`` switched to ``new_type``.

    The section keeps the fields the new type also has and that were set, i.e. differ from the
    default the section came from (``schedule.L: 60`` when a D3 base becomes ``random``: the same chunks
    for every arm); every other field starts from the new type's default, so a preset's own values
    (``d3_paper``'s placement, estimator, solver) are not overwritten by the old type's defaults. A section
    that already has the type, or that is not a registered choice, is unchanged.

    Raises:
        ConfigError: ``new_type`` is not a registered name of the section's family.
    """
    family = _choice_family(data, section)
    node = data
    for part in section[:-1]:
        node = node.get(part) if isinstance(node.get(part), dict) else {}
    current = node.get(section[-1])
    if family is None or not isinstance(current, dict) or current.get("type") == new_type:
        return data
    try:
        new_cls = family.lookup(str(new_type))
    except ValueError as err:
        raise ConfigError(f"{where}: {'.'.join(section)}.type: {err}") from None
    keep = {f.name for f in dataclasses.fields(new_cls) if f.init}
    default = _default_section(section, family, current.get("type"))
    node[section[-1]] = {"type": new_type, **{k: v for k, v in current.items()
                                              if k in keep and (k not in default or v != default[k])}}
    return data


def _default_section(section: list[str], family: type, type_name: Any) -> dict[str, Any]:
    """The values a section of type ``type_name`` holds when nobody set them: the run config's default
    section where it has that type (the no-argument run's D3), else the type's own defaults ({} when the
    type has required fields: then every field counts as set)."""
    node: Any = to_dict(RunConfig())
    for part in section:
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict) and node.get("type") == type_name:
        return node
    try:
        return to_dict(family.lookup(str(type_name))())
    except (TypeError, ValueError):
        return {}


def _choice_family(data: dict[str, Any], section: list[str]) -> type | None:
    """The ChoiceConfig family of the field at ``section`` (walking the concrete types in ``data``)."""
    cls: Any = RunConfig
    node: Any = data
    for i, part in enumerate(section):
        if not dataclasses.is_dataclass(cls):
            return None
        hints = typing.get_type_hints(cls)
        if part not in hints:
            return None
        tp = _unwrap_optional(hints[part])
        is_family = isinstance(tp, type) and issubclass(tp, ChoiceConfig) and ChoiceConfig in tp.__bases__
        if i == len(section) - 1:
            return tp if is_family else None
        node = node.get(part) if isinstance(node, dict) else None
        if is_family:
            if not isinstance(node, dict) or "type" not in node:
                return None
            try:
                tp = tp.lookup(str(node["type"]))
            except ValueError:
                return None
        cls = tp
    return None


def _unwrap_optional(tp: Any) -> Any:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and len(args) == 1:
        return args[0]
    return tp


def check_equal_tokens(base: RunConfig, arm: RunConfig, arm_name: str) -> None:
    """Raise if ``arm`` trains on other tokens than ``base`` (:data:`EQUAL_TOKEN_KEYS`).

    Raises:
        ConfigError: ``arm 'x' changes train.steps (600 → 300) ...``.
    """
    for key in EQUAL_TOKEN_KEYS:
        before, after = _get(to_dict(base), key), _get(to_dict(arm), key)
        if before != after:
            raise ConfigError(
                f"arm {arm_name!r} changes {key} ({before!r} → {after!r}): every arm must train on the same "
                f"tokens ({', '.join(EQUAL_TOKEN_KEYS)} equal); set it for every arm in the top-level `set:`"
            )


def _get(data: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(data, dict):
            return None
        data = data.get(part)
    return data

