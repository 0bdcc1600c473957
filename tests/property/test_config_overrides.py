"""An override changes the keys it names and nothing else, at every depth, for YAML and CLI alike.

The property runs over the whole config tree: every leaf of the no-argument RunConfig and of every
scheduler type's config, overridden through the CLI (``--a.b.c=v``) and through a YAML file
(``a: {b: {c: v}}``), once with its own value (nothing may change) and once with another value
(exactly that leaf may change). A loader that rebuilds a section from its class defaults whenever one
of its keys is given (the lost ``schedule.influence_nice=19`` of the no-argument run, once) fails both.
"""

from __future__ import annotations

import json

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from d3ray.config import RunConfig
from d3ray.config_loading import ConfigError, flatten_dotted, load_config, to_dict
from d3ray.schedule.config import ScheduleConfig


def leaves(cfg: RunConfig) -> dict[str, object]:
    """Dotted key → value of every scalar or list leaf (``type`` keys included)."""
    return dict(flatten_dotted(to_dict(cfg)))


def nested(key: str, value: object) -> dict:
    """``a.b.c``, v → ``{a: {b: {c: v}}}`` (a YAML file's spelling of one override)."""
    out: object = value
    for part in reversed(key.split(".")):
        out = {part: out}
    return out  # type: ignore[return-value]


def other_value(value: object) -> object | None:
    """A different value of the same type, or None where there is no obvious one."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 0.5 if value else 0.25
    return None


#: What a scheduler type needs beyond its defaults to be a valid config.
REQUIRED = {"doremi": ["--schedule.reference_steps=64"]}
BASES = [[]] + [[f"--schedule.type={name}", *REQUIRED.get(name, [])]
                for name in ScheduleConfig.known() if name != "d3"]


def load_both_ways(base: list[str], key: str, value: object, tmp_path) -> tuple[RunConfig, RunConfig]:
    cli = load_config(RunConfig, None, [*base, f"--{key}={json.dumps(value)}"])
    data = nested(key, value)
    for item in reversed(base):  # the base's own overrides, spelled in the same file
        k, v = item[2:].split("=", 1)
        data = _merge(nested(k, yaml.safe_load(v)), data)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    return cli, load_config(RunConfig, path)


def _merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def test_overriding_any_leaf_with_its_own_value_changes_nothing(tmp_path):
    checked = 0
    for base in BASES:
        expected = leaves(load_config(RunConfig, None, base))
        for key, value in expected.items():
            for got in load_both_ways(base, key, value, tmp_path):
                assert leaves(got) == expected, f"{base} --{key}={value!r} changed other keys"
            checked += 1
    assert checked > 500  # the whole tree, every scheduler type


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_overriding_one_leaf_changes_exactly_that_leaf(data, tmp_path_factory):
    base = data.draw(st.sampled_from(BASES), label="base")
    before = leaves(load_config(RunConfig, None, base))
    candidates = sorted(k for k, v in before.items() if other_value(v) is not None)
    key = data.draw(st.sampled_from(candidates), label="key")
    new = other_value(before[key])
    try:
        results = load_both_ways(base, key, new, tmp_path_factory.mktemp("cfg"))
    except ConfigError:
        return  # the field's own validation refuses that value (e.g. a batch size that does not divide)
    for got in results:
        after = leaves(got)
        changed = {k for k in before if after.get(k) != before[k]}
        assert changed == {key}, f"{base} --{key}={new!r} changed {sorted(changed)}"


@pytest.mark.parametrize("override, field, kept", [
    ("--schedule.L=16", "first_chunk", "stream"),              # the no-argument run's D3 knob
    ("--schedule.L=16", "placement.type_name", "in_trainer"),  # ... and its placement
    ("--schedule.solver_pool.num_actors=2", "solver_pool.num_cpus", 0.25),
])
def test_documented_lost_defaults_are_kept(override, field, kept):
    cfg = load_config(RunConfig, None, [override])
    value = cfg.schedule
    for part in field.split("."):
        value = getattr(value, part)
    assert value == kept


def test_selecting_another_type_starts_from_that_types_defaults():
    cfg = load_config(RunConfig, None, ["--schedule.type=random", "--schedule.L=16"])
    assert type(cfg.schedule).__name__ == "RandomScheduleConfig"
    assert cfg.schedule.L == 16
    assert to_dict(cfg.schedule) == {**to_dict(type(cfg.schedule)()), "L": 16}
