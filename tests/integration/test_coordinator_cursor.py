"""The coordinator restarts its stream at a data cursor (restored as from a checkpoint): the chunk
comes back identical, and no chunk before the cursor is produced again."""

import json

import pytest

from d3ray.schedule.chunker import ChunkStream
from d3ray.schedule.config import SequentialScheduleConfig
from d3ray.schedule.coordinator import ScheduleCoordinator
from d3ray.schedule.scheduler import SequentialScheduler
from tests.conftest import start_local_ray
from tests.fakes import make_source

pytestmark = pytest.mark.ray


def test_coordinator_restart_seeks_to_restored_cursor_and_skips_nothing():
    start_local_ray()  # ray.put of the chunk batches
    reference = ChunkStream(make_source(19), batch_size=2, chunk_len=2, shuffle_buffer=3, seed=1)
    expected = [c for c, _ in zip(reference, range(10), strict=False)]
    sources = []

    def make_stream(cursor):
        sources.append(make_source(19))
        return ChunkStream(sources[-1], batch_size=2, chunk_len=2, shuffle_buffer=3, seed=1, cursor=cursor)

    coordinator = ScheduleCoordinator(make_stream, SequentialScheduler(SequentialScheduleConfig(), 0), prefetch_chunks=1)
    for chunk_id in range(8):
        coordinator.get_chunk(chunk_id)
    saved = json.loads(json.dumps(coordinator.cursor(6)))  # what a checkpoint after chunk 5 holds (epoch 1)
    coordinator.release(8)  # chunks (and cursors) before 8 are gone
    assert coordinator.cursor(6) is None
    coordinator.restore_cursor(6, saved)
    got = coordinator.get_chunk(6)  # a trainer resumed from that checkpoint
    assert got.sample_ids == tuple(b.sample_ids for b in expected[6].batches)
    assert coordinator.get_chunk(7).sample_ids == tuple(b.sample_ids for b in expected[7].batches)
    report = coordinator.report()
    assert report["stream_restarts"] == 1 and report["restarts_from_cursor"] == 1
    assert report["chunks_skipped_on_seek"] == 0
    first = sources[-1].readers[0]  # the restarted stream's reader began at the cursor, not at 0
    assert first.i - first.reads == saved["lane"]["reader"]["i"] > 0
