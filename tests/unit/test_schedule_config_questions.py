"""The studies ask a schedule config instead of comparing scheduler names (issue #30): whether its chunks are
ordered by influence, how many influence actors its ``influence_sec`` stands for, and whether its estimator runs
on the trainers' parameter shards. Each answer is checked through the code that asks it (``d3ray compare``'s
plan and compute accounting, the in-trainer check), for D3 alone, D3 as a staged scheduler's order, and others.
"""

from __future__ import annotations

import json

import pytest

from d3ray.compare.compute import run_compute
from d3ray.config import RunConfig
from d3ray.config_loading import load_config
from d3ray.influence.config import InfluenceConfig
from d3ray.influence.estimators import EstimatorConfig
from d3ray.schedule.order.configs import D3ScheduleConfig


def _schedule(*overrides: str):
    return load_config(RunConfig, None, list(overrides)).schedule


@pytest.mark.parametrize(("overrides", "by_influence", "actors"), [
    (["--schedule.type=d3", "--schedule.influence_actors=3"], True, 3),
    (["--schedule.type=loss", "--schedule.order.type=d3", "--schedule.order.influence_actors=2"], True, 2),
    (["--schedule.type=odm", "--schedule.order.type=d3"], True, 1),
    (["--schedule.type=loss"], False, 1),
    (["--schedule.type=random"], False, 1),
    (["--schedule.type=curriculum"], False, 1),
])
def test_schedule_config_answers_for_itself_and_its_order_stage(overrides, by_influence, actors):
    schedule = _schedule(*overrides)
    assert schedule.orders_by_influence is by_influence
    assert schedule.influence_actor_count == actors


def test_compare_compute_scales_influence_seconds_by_the_configs_actor_count(tmp_path):
    (tmp_path / "schedule_log.jsonl").write_text(json.dumps({"chunk_id": 0, "influence_sec": 2.0, "solver_sec": 0.5}) + "\n")
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "train/loss": 1.0, "time/step_sec": 1.0}) + "\n")
    staged = _schedule("--schedule.type=loss", "--schedule.order.type=d3", "--schedule.order.influence_actors=3")
    assert run_compute(tmp_path, 1, staged.influence_actor_count).influence_sec == pytest.approx(6.0)


@pytest.mark.parametrize("name", EstimatorConfig.known())
def test_in_trainer_placement_accepts_exactly_the_estimators_that_run_on_shards(name):
    estimator = EstimatorConfig.lookup(name)()
    build = lambda: D3ScheduleConfig(influence_placement="in_trainer", influence=InfluenceConfig(estimator=estimator))  # noqa: E731
    if name in ("first_order", "drift"):  # one backward, linear over shards (d3ray/train/sharded_influence.py)
        assert build().in_trainer
    else:
        with pytest.raises(ValueError, match=f"not '{name}'.*use influence_placement: actors"):
            build()


@pytest.mark.parametrize(("name", "branched"), [("d3", True), ("d3_paper", True), ("random", True), ("sequential", True),
                                                ("curriculum", False), ("loss", False), ("odm", False)])
def test_census_branches_exactly_the_schedules_whose_decisions_permute_the_stream_batches(tmp_path, name, branched):
    import yaml

    from d3ray.census.census import CensusOptions, check_inputs, load_run
    from d3ray.config_loading import to_dict
    from d3ray.errors import UserError

    cfg = load_config(RunConfig, None, [f"--schedule.type={name}", "--schedule.L=4", "--train.steps=16",
                                        "--train.zero_stage=0"])
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    import torch

    (tmp_path / "checkpoint_0" / "deepspeed" / "ds").mkdir(parents=True)
    (tmp_path / "checkpoint_0" / "state.json").write_text(json.dumps(
        {"step": 4, "next_chunk": 1, "position": 0, "tokens": 0, "schedule": {}}))
    # the header the census reads of a ZeRO-0 checkpoint (d3ray/census/restore.py: checkpoint_layout)
    torch.save({"ds_config": {"zero_optimization": {"stage": 0}}, "dp_world_size": 1},
               tmp_path / "checkpoint_0" / "deepspeed" / "ds" / "mp_rank_00_model_states.pt")
    options = CensusOptions(run_dir=tmp_path, out=tmp_path / "out", checkpoints=[1], chunks=1)
    if branched:
        assert check_inputs(load_run(tmp_path), options) == [1]
    else:
        with pytest.raises(UserError, match=f"schedule.type={name} .* runs of d3, d3_paper, random, sequential$"):
            check_inputs(load_run(tmp_path), options)


@pytest.mark.parametrize(("overrides", "in_actor", "in_coordinator", "sorts"), [
    ([], False, True, True),  # the default: drift, residual none, the AdamW step, scored by the trainers (auto)
    (["--schedule.influence_placement=actors"], True, False, True),  # one influence actor
    (["--schedule.influence_num_gpus=0.25"], True, False, True),  # auto: actors given a GPU share of their own
    (["--schedule.influence.estimator.residual=sketch"], False, False, False),  # a sketched residual: a search may be needed
    (["--schedule.influence_placement=actors", "--schedule.influence_actors=2"], False, False, True),  # f's shares joined, sorted
    (["--schedule.solver.type=exact"], False, False, False),  # the reference solver: S built and searched
    (["--schedule.influence.preconditioner=none"], False, False, False),  # no optimizer state: not the drift potential
    (["--schedule.influence.estimator.type=lookahead"], False, False, False),
    (["--schedule.influence_placement=in_trainer", "--train.zero_stage=3"], False, True, True),  # the trainers' potential
    (["--schedule.influence_placement=in_trainer", "--train.zero_stage=3", "--schedule.influence.estimator.type=first_order"],
     False, False, False),  # the trainers' sketches: the solver actor searches
])
def test_the_potential_alone_is_ordered_where_it_is_scored_and_asks_for_no_solver(overrides, in_actor, in_coordinator,
                                                                                 sorts):
    cfg = _schedule("--schedule.type=d3", *overrides)
    assert cfg.sorts_in_influence_actor is in_actor
    assert cfg.sorts_in_coordinator is in_coordinator
    assert cfg.sorts_potential is sorts  # several actors' shares of f: joined and sorted, no solver either
    roles = [r.role for r in cfg.actor_requests()]
    assert ("solver" not in roles) is sorts
    assert ("influence" in roles) is not cfg.in_trainer
