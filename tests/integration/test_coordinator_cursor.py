"""The coordinator restarts its stream at a data cursor (carried by ``checkpoint_state`` into a new
coordinator): the chunk comes back identical, and no chunk before the cursor is produced again."""

import json

import pytest

from d3ray.schedule.chunker import ChunkStream
from d3ray.schedule.coordinator import ScheduleCoordinator
from d3ray.schedule.order.basic import SequentialScheduler
from d3ray.schedule.scheduler import Needs
from tests.conftest import start_local_ray
from tests.fakes import make_source

pytestmark = pytest.mark.ray


def test_coordinator_resumes_from_checkpointed_cursor_without_rereading():
    start_local_ray()  # ray.put of the chunk batches
    reference = ChunkStream(make_source(19), batch_size=2, chunk_len=2, shuffle_buffer=3, seed=1)
    expected = [c for c, _ in zip(reference, range(10), strict=False)]
    sources = []

    def make_stream(cursor):
        sources.append(make_source(19))
        return ChunkStream(sources[-1], batch_size=2, chunk_len=2, shuffle_buffer=3, seed=1, cursor=cursor)

    first = ScheduleCoordinator(make_stream, SequentialScheduler(), Needs(), prefetch_chunks=1)
    for chunk_id in range(6):
        first.get_chunk(chunk_id)
    saved = json.loads(json.dumps(first.checkpoint_state(6)))  # a checkpoint after chunk 5 (epoch 1)
    assert saved["data_cursor"]["chunk_id"] == 6

    resumed = ScheduleCoordinator(make_stream, SequentialScheduler(), Needs(), prefetch_chunks=1)
    resumed.restore(saved)
    got = resumed.get_chunk(6)  # a trainer resumed from that checkpoint asks for chunk 6
    assert got.sample_ids == tuple(b.sample_ids for b in expected[6].batches)
    assert resumed.get_chunk(7).sample_ids == tuple(b.sample_ids for b in expected[7].batches)
    report = resumed.report()
    assert report["restarts_from_cursor"] == 1 and report["chunks_skipped_on_seek"] == 0
    reader = sources[-1].readers[0]  # the restarted stream's reader began at the cursor, not at 0
    assert reader.i - reader.reads == saved["data_cursor"]["cursor"]["lane"]["reader"]["i"] > 0
