"""Search spaces in YAML: dotted RunConfig keys mapped onto a tiny vocabulary, checked before Ray starts.

    space:
      schedule.L: {grid: [30, 60]}                  # crossed with every other grid axis
      train.lr: {loguniform: [1.0e-4, 3.0e-3]}      # drawn num_samples times per grid point
      schedule.solver.type: {choice: [ils, rsr]}
      schedule.influence: {grid: [{estimator: hutchinson}, {estimator: lookahead, gamma: 0.01}]}
      train.steps: 400                              # a plain value is a constant

The vocabulary maps onto ``ray.tune``: ``grid`` → ``grid_search``, ``choice`` → ``choice``,
``uniform`` / ``loguniform`` → ``uniform`` / ``loguniform`` over [lo, hi], ``randint`` →
``randint`` over lo ≤ x < hi. A value may be a mapping: it sets the keys below the axis' key
together, which is how dependent knobs vary as one axis (an estimator with its own γ). A nested
mapping that is not a vocabulary entry is flattened (``{schedule: {L: {grid: [..]}}}`` is
``schedule.L``), so dotted command-line overrides (``--space.schedule.L='{grid: [4, 8]}'``) work.

Every key is checked against RunConfig before any trial starts: each value of each axis, and every
combination of the grid axes (up to a cap), is built into a RunConfig; an unknown key or a bad value
is a :class:`~d3ray.config_loading.ConfigError` naming the search-space key.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from d3ray.config import RunConfig
from d3ray.config_loading import ConfigError, apply_overrides, flatten_dotted, from_dict, to_dict

logger = logging.getLogger(__name__)

VOCABULARY = ("grid", "choice", "uniform", "loguniform", "randint")
#: Grid combinations built into RunConfigs by :func:`validate_space` (beyond it: each axis alone).
MAX_VALIDATED_COMBINATIONS = 512


@dataclass(frozen=True)
class Axis:
    """One search-space key: a constant or a vocabulary entry."""

    key: str
    """Dotted RunConfig path, e.g. ``schedule.influence.sketch.k``."""
    kind: str
    """``constant`` or one of :data:`VOCABULARY`."""
    values: tuple[Any, ...]
    """grid/choice: the options; uniform/loguniform/randint: (lo, hi); constant: (value,)."""

    @property
    def varies(self) -> bool:
        return self.kind != "constant"

    def candidates(self) -> list[Any]:
        """Values :func:`validate_space` builds: every option; for ranges both ends and an inner,
        non-round point (a float range over an integer field fails there, not in a trial)."""
        if self.kind == "randint":
            return [self.values[0], self.values[1] - 1]
        if self.kind in ("uniform", "loguniform"):
            lo, hi = self.values
            return [lo, hi, lo + (hi - lo) / math.pi]
        return list(self.values)

    def to_tune(self) -> Any:
        """The ``ray.tune`` search-space object (or the constant itself)."""
        from ray import tune

        if self.kind == "constant":
            return self.values[0]
        if self.kind == "grid":
            return tune.grid_search(list(self.values))
        if self.kind == "choice":
            return tune.choice(list(self.values))
        return getattr(tune, self.kind)(*self.values)


def parse_space(raw: Mapping[str, Any]) -> list[Axis]:
    """Axes of a ``space:`` mapping, in file order.

    Raises:
        ConfigError: a malformed vocabulary entry (empty list, lo >= hi, non-numeric bounds ...).
    """
    by_key: dict[str, Axis] = {}
    for key, value in _flatten(raw):  # a key given twice (file, then override): the later one wins
        by_key.pop(key, None)
        by_key[key] = _axis(key, value)
    axes = list(by_key.values())
    seen: set[str] = set()
    for axis in axes:
        for other in seen:
            if axis.key.startswith(other + ".") or other.startswith(axis.key + "."):
                raise ConfigError(f"space: keys {other!r} and {axis.key!r} overlap; set one of them")
        seen.add(axis.key)
    return axes


def _flatten(raw: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    items: list[tuple[str, Any]] = []
    for key, value in raw.items():
        if not isinstance(key, str) or not key:
            raise ConfigError(f"space: key {key!r} must be a non-empty string")
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, Mapping) and not _is_entry(value):
            if not value:
                raise ConfigError(f"space.{path}: an empty mapping sets nothing")
            items.extend(_flatten(value, path))
        else:
            items.append((path, value))
    return items


def _is_entry(value: Mapping[str, Any]) -> bool:
    return len(value) == 1 and next(iter(value)) in VOCABULARY


def _axis(key: str, value: Any) -> Axis:
    if not (isinstance(value, Mapping) and _is_entry(value)):
        return Axis(key, "constant", (value,))
    kind, arg = next(iter(value.items()))
    where = f"space.{key}.{kind}"
    if not isinstance(arg, list) or not arg:
        raise ConfigError(f"{where}: expected a non-empty list, got {arg!r}")
    if kind in ("grid", "choice"):
        return Axis(key, kind, tuple(arg))
    if len(arg) != 2 or not all(_is_number(v) for v in arg):
        raise ConfigError(f"{where}: expected [lo, hi] numbers, got {arg!r}")
    lo, hi = arg
    if not lo < hi:
        raise ConfigError(f"{where}: lo={lo} must be < hi={hi}")
    if kind == "loguniform" and not lo > 0:
        raise ConfigError(f"{where}: lo={lo} must be > 0")
    if kind == "randint":
        if not (float(lo).is_integer() and float(hi).is_integer()):
            raise ConfigError(f"{where}: bounds must be integers, got {arg!r}")
        return Axis(key, kind, (int(lo), int(hi)))
    return Axis(key, kind, (float(lo), float(hi)))


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def tune_param_space(axes: list[Axis]) -> dict[str, Any]:
    """The flat ``param_space`` for ``ray.tune.Tuner`` (dotted keys → tune objects or constants)."""
    return {axis.key: axis.to_tune() for axis in axes}


def trial_dict(base: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` (a RunConfig as a plain dict) with a trial's dotted ``params`` applied.

    A mapping value sets the keys below its key (``schedule.influence: {estimator: lookahead}``
    sets ``schedule.influence.estimator``). Values go through :func:`apply_overrides` as JSON
    (valid YAML), so a trial's config is exactly what the same dotted overrides on the command
    line would give.
    """
    overrides = [f"{key}={json.dumps(_plain(value))}" for key, value in flatten_dotted(params)]
    return apply_overrides(dict(base), overrides)


def _plain(value: Any) -> Any:
    """numpy scalars (Tune's samplers return them) → Python scalars; containers recursively."""
    if hasattr(value, "item") and not isinstance(value, (list, tuple, dict)):
        return value.item()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def trial_run_config(base: Mapping[str, Any], params: Mapping[str, Any], **fixed: Any) -> RunConfig:
    """The RunConfig of one trial: base + the trial's params + ``fixed`` run-level fields (name, output_dir)."""
    data = trial_dict(base, params)
    data.update(fixed)
    return from_dict(RunConfig, data)


def validate_space(base: Mapping[str, Any], axes: list[Axis]) -> list[RunConfig]:
    """Build RunConfigs from every candidate value; the distinct configs built (for resource sizing).

    Checks base + constants, then each varying axis' candidates with the others at their first
    candidate, then every grid/choice combination when there are at most
    :data:`MAX_VALIDATED_COMBINATIONS` of them (so that a grid over ``schedule.type`` crossed with
    a key only one scheduler has is caught before any trial runs).

    Raises:
        ConfigError: naming the search-space key(s) whose value does not fit RunConfig.
    """
    constants = {a.key: a.values[0] for a in axes if not a.varies}
    varying = [a for a in axes if a.varies]
    first = {a.key: a.candidates()[0] for a in varying}
    built: dict[str, RunConfig] = {}

    def build(params: dict[str, Any], keys: list[str]) -> None:
        try:
            cfg = from_dict(RunConfig, trial_dict(base, params))
        except ConfigError as err:
            blame = _culprits(base, params, keys) or keys
            what = ", ".join(repr(k) for k in blame) or "(the base config)"
            raise ConfigError(
                f"search space key{'s' if len(blame) > 1 else ''} {what}: {err}{_hint(blame)}"
            ) from None
        built[json.dumps(to_dict(cfg), sort_keys=True, default=str)] = cfg

    build(dict(constants), list(constants))
    for axis in varying:
        for value in axis.candidates():
            build({**constants, **first, axis.key: value}, [*first, *constants])
    discrete = [a for a in varying if a.kind in ("grid", "choice")]
    n_combos = math.prod(len(a.values) for a in discrete) if discrete else 0
    if len(discrete) > 1 and n_combos <= MAX_VALIDATED_COMBINATIONS:
        for combo in itertools.product(*(a.values for a in discrete)):
            build(
                {**constants, **first, **{a.key: v for a, v in zip(discrete, combo, strict=True)}},
                [*first, *constants],
            )
    elif n_combos > MAX_VALIDATED_COMBINATIONS:
        logger.warning("search space has %d grid/choice combinations; each axis was checked alone", n_combos)
    return list(built.values())


def _culprits(base: Mapping[str, Any], params: dict[str, Any], keys: list[str]) -> list[str]:
    """The keys among ``keys`` without which ``params`` builds a valid RunConfig (the ones to blame)."""
    out = []
    for key in keys:
        try:
            from_dict(RunConfig, trial_dict(base, {k: v for k, v in params.items() if k != key}))
        except ConfigError:
            continue
        out.append(key)
    return out


def _hint(keys: list[str]) -> str:
    """`` (did you mean ...?)`` for keys that are no RunConfig path, with the paths that end like them."""
    import dataclasses

    from d3ray.schedule.config import ScheduleConfig

    known = {p for p in _leaf_paths(to_dict(RunConfig())) if not p.startswith("schedule.")}
    for name in ScheduleConfig.known():  # the paths under every scheduler, not only the base's
        # From the fields, not an instance: some schedulers have no valid defaults (DoReMi's reference).
        for f in dataclasses.fields(ScheduleConfig.lookup(name)):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            nested = to_dict(default) if dataclasses.is_dataclass(default) else None
            known.update(_leaf_paths(nested, f"schedule.{f.name}") if nested else [f"schedule.{f.name}"])
    hints = []
    for key in keys:
        if key in known or any(k.startswith(key + ".") for k in known):
            continue
        last = key.rsplit(".", 1)[-1]
        hints += [p for p in sorted(known) if p.rsplit(".", 1)[-1] == last][:3]
    return f" (did you mean {' or '.join(hints)}?)" if hints else ""


def _leaf_paths(data: Any, prefix: str = "") -> list[str]:
    if not isinstance(data, dict):
        return [prefix]
    out = []
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else key
        out.extend(_leaf_paths(value, path) if isinstance(value, dict) and value else [path])
    return out


def varying_keys(axes: list[Axis]) -> list[str]:
    """The keys of the axes that vary (the results table's parameter columns)."""
    return [a.key for a in axes if a.varies]
