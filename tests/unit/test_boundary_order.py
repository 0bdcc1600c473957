"""Which chunk boundaries save their checkpoint before the trainers' preparation of the next version: the
trainers' own scoring (the default D3) and D3's influence actors' snapshot, at staleness >= 1, whose next chunk
was decided a boundary earlier."""

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
    (("--schedule.placement={type: actors}",), True),  # the snapshot is read for the chunk after the next
    (("--schedule.placement={type: actors}", "--schedule.staleness=0"), False),  # read for the next chunk
    (("--schedule.type=d3_paper",), True),
    (("--schedule.type=less",), False),  # a snapshot whose reader declares no staleness: published first
    (("--schedule.type=random",), False),  # nothing to prepare
    (("--schedule.type=odm",), False),  # feedback only
])
def test_only_preparations_read_after_the_next_chunk_wait_for_the_checkpoint(overrides, after):
    assert prepares_after_checkpoint(_requests(*overrides)) is after
