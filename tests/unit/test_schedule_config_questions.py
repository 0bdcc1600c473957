"""What a D3 schedule config answers for itself: which estimators its ``in_trainer`` placement accepts, and
where the drift potential alone is ordered (and that it then asks for no solver actor). The questions the
studies ask of a config (ordered by influence, influence actors, permutes the stream's batches) are the
lab's: tests/lab/test_schedule_questions.py.
"""

from __future__ import annotations

import pytest

from d3ray.config import RunConfig
from d3ray.config_loading import load_config
from d3ray.influence.config import InfluenceConfig
from d3ray.influence.estimators import EstimatorConfig
from d3ray.schedule.order.d3 import D3ScheduleConfig, InTrainerPlacement


def _schedule(*overrides: str):
    return load_config(RunConfig, None, list(overrides)).schedule


@pytest.mark.parametrize("name", EstimatorConfig.known())
def test_in_trainer_placement_accepts_exactly_the_estimators_that_run_on_shards(name):
    estimator = EstimatorConfig.lookup(name)()
    build = lambda: D3ScheduleConfig(placement=InTrainerPlacement(), influence=InfluenceConfig(estimator=estimator))  # noqa: E731
    if name in ("first_order", "drift"):  # one backward, linear over shards (d3ray/train/scheduling/sharded_influence.py)
        assert build().placement.type_name == "in_trainer"
    else:
        with pytest.raises(ValueError, match=f"not '{name}'.*use schedule.placement.type=actors"):
            build()


@pytest.mark.parametrize(("overrides", "in_actor", "in_coordinator", "sorts"), [
    ([], False, True, True),  # the default: drift, residual none, the AdamW step, scored by the trainers (in_trainer)
    (["--schedule.placement.type=actors"], True, False, True),  # one influence actor
    (["--schedule.placement={type: actors, num_gpus: 0.25}"], True, False, True),  # an actor on a GPU share
    (["--schedule.influence.estimator.residual=sketch", "--schedule.placement.type=actors"], False, False, False),
    (["--schedule.placement={type: actors, count: 2}"], False, False, True),  # f's shares joined, sorted
    (["--schedule.solver.type=exact"], False, False, False),  # the reference solver: S built and searched
    (["--schedule.influence.preconditioner=none", "--schedule.placement.type=actors"], False, False, False),  # not the potential
    (["--schedule.influence.estimator.type=lookahead", "--schedule.placement.type=actors"], False, False, False),
    (["--train.zero_stage=3"], False, True, True),  # the trainers' potential on their shards
    (["--train.zero_stage=3", "--schedule.influence.estimator.type=first_order"],
     False, False, False),  # the trainers' sketches: the solver actor searches
])
def test_the_potential_alone_is_ordered_where_it_is_scored_and_asks_for_no_solver(overrides, in_actor, in_coordinator,
                                                                                 sorts):
    cfg = _schedule("--schedule.type=d3", *overrides)
    in_trainer = cfg.placement.type_name == "in_trainer"
    assert (not in_trainer and cfg.placement.sorts_in_actor(cfg)) is in_actor
    assert (in_trainer and cfg.sorts_potential) is in_coordinator  # the coordinator sorts the trainers' f
    assert cfg.sorts_potential is sorts  # several actors' shares of f: joined and sorted, no solver either
    roles = [r.role for r in cfg.actor_requests()]
    assert ("solver" not in roles) is sorts
    assert ("influence" in roles) is not in_trainer
