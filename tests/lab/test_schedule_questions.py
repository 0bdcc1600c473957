"""The questions the studies ask of a schedule config, answered by the lab (``d3ray/lab/schedule_questions.py``):
whether its chunks are ordered by D3 influence (``d3ray compare``'s methods), how many influence actors its
``influence_sec`` stands for (compare's compute accounting) and whether its decisions permute the stream's
batches (what ``d3ray census`` branches). Each is checked for D3 alone, D3 as a staged scheduler's order, and
others, and through the code that asks it; and none of them is a member of a schedule config any more.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from d3ray.config import RunConfig
from d3ray.config_loading import load_config
from d3ray.lab.compare.compute import run_compute
from d3ray.lab.schedule_questions import (
    STUDY_TABLE,
    census_schedule_types,
    influence_actor_count,
    orders_by_influence,
    permutes_stream_batches,
)
from d3ray.schedule.config import ScheduleConfig
from d3ray.schedule.scheduler import ActorRequest


def _schedule(*overrides: str) -> ScheduleConfig:
    return load_config(RunConfig, None, list(overrides)).schedule


@dataclass(frozen=True, kw_only=True)
class _DeclaresActors(ScheduleConfig):
    """An unregistered scheduler config that declares three influence actors and two solver actors."""

    def actor_requests(self) -> list[ActorRequest]:
        return [ActorRequest("influence", 3, {"CPU": 1.0}), ActorRequest("solver", 2, {"CPU": 0.25})]


@pytest.mark.parametrize(("overrides", "by_influence"), [
    (["--schedule.type=d3"], True),
    (["--schedule.type=d3_paper"], True),  # a subclass of d3's config: d3's row
    (["--schedule.type=loss", "--schedule.order.type=d3"], True),  # a selector asks its order stage
    (["--schedule.type=odm", "--schedule.order.type=d3"], True),  # a mixer too
    (["--schedule.type=loss"], False),
    (["--schedule.type=random"], False),
    (["--schedule.type=curriculum"], False),
])
def test_orders_by_influence_answers_for_the_config_and_its_order_stage(overrides, by_influence):
    assert orders_by_influence(_schedule(*overrides)) is by_influence


@pytest.mark.parametrize(("overrides", "actors"), [
    (["--schedule.type=odm", "--schedule.order.type=d3"], 1),
    (["--schedule.type=loss"], 1),  # a scorer actor, no influence actor
    (["--schedule.type=random"], 1),
])
def test_influence_actor_count_of_real_configs(overrides, actors):
    assert influence_actor_count(_schedule(*overrides)) == actors


def test_influence_actor_count_is_the_influence_actors_a_config_declares():
    schedule = _schedule("--schedule.type=loss", "--schedule.order.type=d3")
    declared = sum(r.count for r in schedule.actor_requests() if r.role == "influence")
    assert influence_actor_count(schedule) == max(declared, 1)
    assert influence_actor_count(_DeclaresActors()) == 3  # the solver actors do not count


def test_compare_compute_scales_influence_seconds_by_the_declared_actor_count(tmp_path):
    (tmp_path / "schedule_log.jsonl").write_text(json.dumps({"chunk_id": 0, "influence_sec": 2.0, "solver_sec": 0.5}) + "\n")
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "train/loss": 1.0, "time/step_sec": 1.0}) + "\n")
    assert run_compute(tmp_path, 1, influence_actor_count(_DeclaresActors())).influence_sec == pytest.approx(6.0)
    assert run_compute(tmp_path, 1, influence_actor_count(_schedule("--schedule.type=random"))).influence_sec == (
        pytest.approx(2.0))


def test_permutes_stream_batches_for_every_registered_scheduler():
    permuting = {name for name in ScheduleConfig.known() if permutes_stream_batches(ScheduleConfig.lookup(name))}
    assert permuting == {"d3", "d3_paper", "random", "sequential"}
    assert census_schedule_types() == sorted(permuting)
    assert not permutes_stream_batches(_DeclaresActors)  # no row of its own nor of a base


def test_the_table_names_registered_schedulers_only():
    assert set(STUDY_TABLE) <= set(ScheduleConfig.known())


@pytest.mark.parametrize("name", ScheduleConfig.known())
def test_the_study_questions_are_no_part_of_a_schedule_config(name):
    cls = ScheduleConfig.lookup(name)
    for question in ("orders_by_influence", "influence_actor_count", "permutes_stream_batches", "summary_fields"):
        assert not hasattr(cls, question), f"schedule.type={name} declares {question}: it belongs to d3ray/lab"


@pytest.mark.parametrize(("name", "branched"), [("d3", True), ("d3_paper", True), ("random", True), ("sequential", True),
                                                ("curriculum", False), ("loss", False), ("odm", False)])
def test_census_branches_exactly_the_schedules_whose_decisions_permute_the_stream_batches(tmp_path, name, branched):
    import torch
    import yaml

    from d3ray.config_loading import to_dict
    from d3ray.errors import UserError
    from d3ray.lab.census.census import CensusOptions, check_inputs, load_run

    cfg = load_config(RunConfig, None, [f"--schedule.type={name}", "--schedule.L=4", "--train.steps=16",
                                        "--train.zero_stage=0"])
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    (tmp_path / "checkpoint_0" / "deepspeed" / "ds").mkdir(parents=True)
    (tmp_path / "checkpoint_0" / "state.json").write_text(json.dumps(
        {"step": 4, "next_chunk": 1, "position": 0, "tokens": 0, "schedule": {}}))
    # the header the census reads of a ZeRO-0 checkpoint (d3ray/lab/census/restore.py: checkpoint_layout)
    torch.save({"ds_config": {"zero_optimization": {"stage": 0}}, "dp_world_size": 1},
               tmp_path / "checkpoint_0" / "deepspeed" / "ds" / "mp_rank_00_model_states.pt")
    options = CensusOptions(run_dir=tmp_path, out=tmp_path / "out", checkpoints=[1], chunks=1)
    if branched:
        assert check_inputs(load_run(tmp_path), options) == [1]
    else:
        with pytest.raises(UserError, match=f"schedule.type={name} .* runs of d3, d3_paper, random, sequential$"):
            check_inputs(load_run(tmp_path), options)
