"""Which chunk boundaries save their checkpoint before the trainers' preparation of the next version: only the
trainers' own scoring at staleness >= 1 (the default D3), whose next chunk was decided a boundary earlier."""

from __future__ import annotations

import pytest

from d3ray.config import RunConfig
from d3ray.config_loading import load_config
from d3ray.train.scheduling.trainer_side import prepares_after_checkpoint


def _requests(*overrides: str):
    return load_config(RunConfig, None, list(overrides)).schedule.trainer_requests()


@pytest.mark.parametrize(("overrides", "after"), [
    ((), True),  # the no-argument run: the trainers score the chunk after the next
    (("--schedule.staleness=0",), False),  # the next chunk is scored at this boundary: before the save
    (("--schedule.placement={type: actors}",), False),  # a weights snapshot the next decision may read
    (("--schedule.type=d3_paper",), False),
    (("--schedule.type=random",), False),  # nothing to prepare
    (("--schedule.type=odm",), False),  # feedback only
])
def test_only_the_trainers_own_scoring_ahead_of_the_next_chunk_waits_for_the_checkpoint(overrides, after):
    assert prepares_after_checkpoint(_requests(*overrides)) is after
