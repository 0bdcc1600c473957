"""Sweep search spaces: the YAML vocabulary, dotted keys checked against RunConfig before Ray starts,
trial configs built exactly as dotted overrides would build them, and the shipped tune_configs."""

from __future__ import annotations

import numpy as np
import pytest

from d3ray.config import RunConfig
from d3ray.config_loading import ConfigError, load_config
from d3ray.tune.config import SweepConfig
from d3ray.tune.results import gamma_changes_order
from d3ray.tune.search_space import (
    Axis,
    parse_space,
    trial_dict,
    trial_run_config,
    tune_param_space,
    validate_space,
)
from d3ray.tune.sweep import prepare
from d3ray.tune.trial_resources import derive_max_concurrent_trials
from tests.conftest import REPO

BASE = {"schedule": {"type": "random"}}


def test_parse_space_vocabulary_each_entry_maps_to_its_kind():
    axes = parse_space(
        {
            "schedule.L": {"grid": [4, 8]},
            "train.lr": {"loguniform": [1e-4, 1e-2]},
            "train.warmup_steps": {"randint": [2, 6]},
            "seed": {"choice": [0, 1]},
            "train.min_lr_ratio": {"uniform": [0.0, 0.5]},
            "train.steps": 16,
        }
    )
    assert [(a.key, a.kind, a.values) for a in axes] == [
        ("schedule.L", "grid", (4, 8)),
        ("train.lr", "loguniform", (1e-4, 1e-2)),
        ("train.warmup_steps", "randint", (2, 6)),
        ("seed", "choice", (0, 1)),
        ("train.min_lr_ratio", "uniform", (0.0, 0.5)),
        ("train.steps", "constant", (16,)),
    ]
    assert Axis("k", "randint", (2, 6)).candidates() == [2, 5]  # hi excluded, as ray.tune.randint


def test_parse_space_nested_mapping_flattens_and_later_key_wins():
    # what `--space.schedule.L='{grid: [2, 4]}'` makes of a file that has `schedule.L: {grid: [4, 8]}`
    axes = parse_space(
        {"schedule.L": {"grid": [4, 8]}, "train": {"steps": 8}, "schedule": {"L": {"grid": [2, 4]}}}
    )
    assert [(a.key, a.values) for a in axes] == [("train.steps", (8,)), ("schedule.L", (2, 4))]


@pytest.mark.parametrize(
    "space, message",
    [
        ({"schedule.L": {"grid": []}}, "space.schedule.L.grid: expected a non-empty list"),
        ({"train.lr": {"uniform": [0.1, 0.01]}}, "lo=0.1 must be < hi=0.01"),
        ({"train.lr": {"loguniform": [0.0, 0.1]}}, "lo=0.0 must be > 0"),
        ({"train.lr": {"uniform": [0.1]}}, "expected [lo, hi] numbers"),
        ({"train.steps": {"randint": [1.5, 4]}}, "bounds must be integers"),
        ({"schedule.influence": {"grid": [{"gamma": 0.1}]}, "schedule.influence.gamma": 0.2}, "overlap"),
    ],
)
def test_parse_space_malformed_entry_raises_naming_it(space, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_space(space)


def test_tune_param_space_maps_vocabulary_onto_ray_tune():
    space = tune_param_space(
        parse_space(
            {"schedule.L": {"grid": [4, 8]}, "train.lr": {"loguniform": [1e-4, 1e-2]}, "train.steps": 16}
        )
    )
    assert space["schedule.L"] == {"grid_search": [4, 8]}
    assert (space["train.lr"].lower, space["train.lr"].upper) == (1e-4, 1e-2)
    assert space["train.steps"] == 16


def test_trial_dict_dotted_keys_and_mapping_values_match_cli_overrides():
    base = load_config(RunConfig, REPO / "jobs" / "configs" / "tiny.yaml")
    from d3ray.config_loading import to_dict

    params = {
        "schedule.type": "d3",
        "schedule.L": np.int64(6),
        "schedule.placement": {"type": "actors", "nice": np.int64(19)},  # look-ahead steps: influence actors
        "schedule.influence": {"estimator": "lookahead", "gamma": np.float64(0.01)},
    }
    cfg = trial_run_config(to_dict(base), params, name="t-1", output_dir="/tmp/x")
    cli = load_config(
        RunConfig,
        REPO / "jobs" / "configs" / "tiny.yaml",
        [
            "--schedule.type=d3",
            "--schedule.L=6",
            "--schedule.placement={type: actors, nice: 19}",
            "--schedule.influence.estimator=lookahead",
            "--schedule.influence.gamma=0.01",
            "--name=t-1",
            "--output_dir=/tmp/x",
        ],
    )
    assert cfg == cli
    assert trial_dict({"a": {"b": 1}}, {"a.c": 2}) == {"a": {"b": 1, "c": 2}}


def test_validate_space_unknown_key_raises_naming_key_with_hint():
    with pytest.raises(
        ConfigError, match=r"search space key 'influence\.k'.*did you mean schedule\.influence\.sketch\.k"
    ):
        validate_space(
            BASE, parse_space({"schedule.L": {"grid": [4, 8]}, "influence.k": {"grid": [512, 1024]}})
        )


def test_validate_space_key_missing_under_one_grid_scheduler_raises_naming_that_key():
    space = {"schedule.type": {"grid": ["d3", "random"]}, "schedule.influence.gamma": {"grid": [0.1, 0.2]}}
    message = r"key 'schedule\.influence\.gamma': unknown key 'schedule\.influence' for RandomScheduleConfig"
    with pytest.raises(ConfigError, match=message):
        validate_space(BASE, parse_space(space))
    d3_base = {"schedule": {"type": "d3"}}  # over a d3 base the pair is to blame: either alone builds
    with pytest.raises(
        ConfigError, match=r"keys? 'schedule\.type', 'schedule\.influence\.gamma': unknown key"
    ):
        validate_space(d3_base, parse_space(space))


def test_validate_space_float_range_over_integer_field_raises_before_any_trial():
    with pytest.raises(ConfigError, match="train.steps: expected an integer"):
        validate_space(BASE, parse_space({"train.steps": {"uniform": [8, 16]}}))


def test_validate_space_builds_each_distinct_candidate_config():
    configs = validate_space(
        BASE, parse_space({"schedule.L": {"grid": [4, 8]}, "seed": {"choice": [0, 1]}, "train.steps": 8})
    )
    assert sorted((c.schedule.L, c.seed) for c in configs) == [(4, 0), (4, 1), (8, 0), (8, 1)]
    assert all(c.train.steps == 8 for c in configs)


def test_k_L_gamma_yaml_gamma_axis_uses_lookahead_and_k_axis_hutchinson():
    sweep = load_config(SweepConfig, REPO / "tune_configs" / "k_L_gamma.yaml")
    _, axes, configs = prepare(sweep)
    configs = [c for c in configs if c.schedule.L in (12, 24, 48)]  # the trials (not the base, also validated)
    grids = {a.key: a for a in axes if a.kind == "grid"}
    assert set(grids) == {"schedule.L", "schedule.influence"}
    assert len(grids["schedule.L"].values) * len(grids["schedule.influence"].values) == 15
    assert all(c.schedule.type_name == "d3" for c in configs)
    lookahead = [c for c in configs if gamma_changes_order(c) == "yes"]
    taylor = [c for c in configs if gamma_changes_order(c) == "no"]
    assert {c.schedule.influence.gamma for c in lookahead} == {1e-3, 1e-2, 1e-1}
    assert {c.schedule.influence.estimator.type_name for c in taylor} == {"hutchinson"}
    assert {c.schedule.influence.sketch.k for c in taylor} == {512, 3500}
    assert {c.schedule.influence.gamma for c in taylor} == {1e-3}, "γ is not varied where it cannot matter"
    assert all(c.train.eval_every % c.schedule.L == 0 for c in configs), "each eval lands on a report"


def test_tiny_yaml_two_trials_validate():
    sweep = load_config(SweepConfig, REPO / "tune_configs" / "tiny.yaml")
    _, axes, configs = prepare(sweep)
    assert [a.key for a in axes if a.varies] == ["schedule.L"] and len(configs) == 2


@pytest.mark.parametrize(
    "cluster, per_trial, expected",
    [
        ({"CPU": 4.0}, {"CPU": 3.01}, 1),
        ({"CPU": 64.0, "GPU": 8.0}, {"CPU": 4.0, "GPU": 2.5}, 3),
        ({"CPU": 64.0, "GPU": 8.0, "solver_node": 2.0}, {"CPU": 4.0, "GPU": 2.0, "solver_node": 1.0}, 2),
        ({"CPU": 2.0}, {"CPU": 3.0, "GPU": 1.0}, 1),  # too small now (autoscaling): at least 1
        ({"CPU": 6.0}, {"CPU": 2.0}, 3),
    ],
)
def test_derive_max_concurrent_trials_min_over_resources(cluster, per_trial, expected):
    assert derive_max_concurrent_trials(cluster, per_trial) == expected
