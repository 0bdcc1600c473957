"""D3's first chunk (``schedule.first_chunk``): chunk 0 in stream order at once, without influence,
so that the trainers' first step does not wait (issue #29 item 3); the other chunks as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from d3ray.config import FIRST_RUN_SCHEDULE, RunConfig
from d3ray.config_loading import load_config
from d3ray.data.chunker import Chunk
from d3ray.schedule.order.d3 import D3ScheduleConfig
from d3ray.schedule.order.d3.placements.actors import ActorsSubmitter
from d3ray.schedule.order.d3.scheduler import D3Scheduler
from d3ray.schedule.scheduler import SubmitContext

REPO = Path(__file__).resolve().parents[2]


def _chunk(size: int, chunk_id: int) -> Chunk:
    return Chunk(chunk_id=chunk_id, epoch=0, batches=(None,) * size, capacity=size)  # type: ignore[arg-type]


def _scheduler(cfg: D3ScheduleConfig) -> D3Scheduler:
    """A D3Scheduler without its actors (the class default placement, ``actors``, with none started): the
    decisions tested here are made before any actor is used."""
    scheduler = D3Scheduler.__new__(D3Scheduler)
    scheduler.cfg = cfg
    scheduler.submitter = ActorsSubmitter(cfg, actors=[], solver_pool=None, seed=0)
    return scheduler


def test_d3_first_chunk_stream_chunk0_is_stream_order_logged_not_fallback() -> None:
    scheduler = _scheduler(D3ScheduleConfig(first_chunk="stream"))
    decision = scheduler.submit(_chunk(8, 0), (), SubmitContext()).result(0.0)
    assert decision.order == tuple(range(8))
    assert decision.fallback is False
    assert decision.record["first_chunk"] == "stream_order"
    assert decision.record["estimator"] == "drift(residual=none, potential=step, tokens_per_pass=512)"


def test_d3_first_chunk_stream_later_chunk_without_weights_falls_back() -> None:
    scheduler = _scheduler(D3ScheduleConfig(first_chunk="stream"))
    decision = scheduler.submit(_chunk(8, 1), (), SubmitContext()).result(0.0)
    assert decision.fallback is True and "first_chunk" not in decision.record
    assert decision.record["fallback_reason"] == "no weights snapshot published in time"


def test_d3_first_chunk_scored_chunk0_without_weights_falls_back() -> None:
    scheduler = _scheduler(D3ScheduleConfig())
    decision = scheduler.submit(_chunk(8, 0), (), SubmitContext()).result(0.0)
    assert decision.fallback is True


def test_d3_first_chunk_unknown_value_raises() -> None:
    with pytest.raises(ValueError, match="first_chunk='sometimes'"):
        D3ScheduleConfig(first_chunk="sometimes")  # type: ignore[arg-type]


def test_tiny_yaml_schedule_is_the_no_argument_default() -> None:
    assert FIRST_RUN_SCHEDULE.first_chunk == "stream"
    assert load_config(RunConfig, REPO / "jobs" / "configs" / "tiny.yaml").schedule == FIRST_RUN_SCHEDULE


def test_d3_sketches_anything_default_potential_alone_false_else_true() -> None:
    from d3ray.influence.config import InfluenceConfig
    from d3ray.influence.estimators import DriftConfig
    from d3ray.schedule.order.d3.influence_actor import sketches_anything

    assert sketches_anything(InfluenceConfig()) is False  # no reference, no means: the actors share chunk 0 too
    assert sketches_anything(InfluenceConfig(estimator=DriftConfig(residual="sketch"))) is True
    assert sketches_anything(InfluenceConfig(estimator=DriftConfig(), preconditioner="none")) is True
