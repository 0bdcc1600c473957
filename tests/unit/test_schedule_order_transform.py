"""Order transforms (reverse, alternate) and the random scheduler's order seed: hand-computed cases."""

from __future__ import annotations

import pytest

from d3ray.config_loading import from_dict
from d3ray.data.chunker import Chunk
from d3ray.schedule.config import ScheduleConfig
from d3ray.schedule.order.basic import RandomScheduler
from d3ray.schedule.order.transform import TransformedScheduler, transform_order, with_order_transform
from d3ray.schedule.scheduler import SubmitContext


def test_transform_order_reverse_reads_backwards() -> None:
    assert transform_order((3, 0, 2, 1), "reverse") == (1, 2, 0, 3)


def test_transform_order_alternate_even_length_interleaves_the_ends() -> None:
    # o = (3, 0, 2, 1): o0, o3, o1, o2
    assert transform_order((3, 0, 2, 1), "alternate") == (3, 1, 0, 2)


def test_transform_order_alternate_odd_length_ends_in_the_middle() -> None:
    assert transform_order((10, 11, 12, 13, 14), "alternate") == (10, 14, 11, 13, 12)


def test_transform_order_none_and_short_orders_are_unchanged() -> None:
    assert transform_order((2, 0, 1), "none") == (2, 0, 1)
    assert transform_order((5,), "alternate") == (5,)
    assert transform_order((), "reverse") == ()


def test_transform_order_unknown_kind_raises_naming_the_field() -> None:
    with pytest.raises(ValueError, match="schedule.order_transform"):
        transform_order((0, 1), "sideways")


def test_schedule_config_order_transform_unknown_value_raises() -> None:
    with pytest.raises(ValueError, match="order_transform='sideways'"):
        ScheduleConfig.lookup("random")(order_transform="sideways")


def _chunk(size: int, chunk_id: int = 3) -> Chunk:
    return Chunk(chunk_id=chunk_id, epoch=0, batches=(None,) * size, capacity=size)  # type: ignore[arg-type]


def test_transformed_scheduler_reverse_reverses_the_random_order_and_logs_it() -> None:
    inner = RandomScheduler(seed=7)
    plain = inner.submit(_chunk(8), (), SubmitContext()).result(None)
    wrapped = with_order_transform(RandomScheduler(seed=7), "reverse")
    assert isinstance(wrapped, TransformedScheduler)
    decided = wrapped.submit(_chunk(8), (), SubmitContext()).result(None)
    assert decided.order == plain.order[::-1]
    assert decided.record["order_transform"] == "reverse"
    assert with_order_transform(inner, "none") is inner


def test_random_scheduler_order_seed_gives_another_order_and_zero_the_baselines() -> None:
    base = RandomScheduler(seed=1).submit(_chunk(8), (), SubmitContext()).result(None).order
    same = RandomScheduler(seed=1, order_seed=0).submit(_chunk(8), (), SubmitContext()).result(None).order
    other = RandomScheduler(seed=1, order_seed=1).submit(_chunk(8), (), SubmitContext()).result(None).order
    assert same == base
    assert other != base and sorted(other) == list(range(8))


def test_random_schedule_config_order_seed_parses_from_yaml_dict() -> None:
    cfg = from_dict(ScheduleConfig, {"type": "random", "order_seed": 1, "order_transform": "alternate"})
    assert (cfg.order_seed, cfg.order_transform) == (1, "alternate")
