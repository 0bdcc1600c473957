"""The coordinator restarts its stream at a data cursor (carried by ``checkpoint_state`` into a new
coordinator): the chunk comes back identical, and no chunk before the cursor is produced again."""

import pytest

from d3ray.schedule.coordinator import ScheduleCoordinator
from d3ray.schedule.order.basic import SequentialScheduler
from d3ray.schedule.scheduler import TrainerRequests
from tests.conftest import start_local_ray
from tests.fakes import make_list_chunk_stream as make_stream

pytestmark = pytest.mark.ray


def test_coordinator_resumes_from_checkpointed_cursor_without_rereading():
    ray = start_local_ray()
    expected = [c for c, _ in zip(make_stream(None), range(10), strict=False)]
    coordinator = ray.remote(ScheduleCoordinator).options(max_concurrency=4)
    first = coordinator.remote(make_stream, SequentialScheduler(), TrainerRequests(), 1)
    resumed = None
    try:
        for chunk_id in range(6):
            ray.get(first.get_chunk.remote(chunk_id))
        saved = ray.get(first.checkpoint_state.remote(6))  # a checkpoint after chunk 5 (in epoch 1)
        assert saved["data_cursor"]["chunk_id"] == 6 and saved["data_cursor"]["cursor"]["chunk_id"] == 6
        resumed = coordinator.remote(make_stream, SequentialScheduler(), TrainerRequests(), 1)
        ray.get(resumed.restore.remote(saved))
        for chunk_id in (6, 7):  # the trainers resumed from that checkpoint
            got = ray.get(resumed.get_chunk.remote(chunk_id))
            assert got.sample_ids == tuple(b.sample_ids for b in expected[chunk_id].batches)
        report = ray.get(resumed.report.remote())
        assert report["restarts_from_cursor"] == 1  # the stream jumped to the cursor of chunk 6 ...
        assert report["chunks_skipped_on_seek"] == 0  # ... and produced no chunk before it again
        assert all(cid >= 6 for cid in report["served"])
    finally:
        ray.kill(first)
        if resumed is not None:
            ray.kill(resumed)



def test_coordinator_seeks_back_to_a_released_chunk_from_the_newest_cursor_before_it():
    """Trainers that roll back to a checkpoint ask for a chunk the coordinator already released: the
    producer restarts its stream at the newest data cursor it knows at or before that chunk (the
    checkpoint's, restored) and skips forward from there, or re-reads from chunk 0 without one; the
    chunk comes back identical each time."""
    ray = start_local_ray()
    expected = [c for c, _ in zip(make_stream(None), range(10), strict=False)]

    def ids(chunk_id: int) -> tuple:
        return tuple(b.sample_ids for b in expected[chunk_id].batches)

    coordinator = ray.remote(ScheduleCoordinator).options(max_concurrency=4).remote(
        make_stream, SequentialScheduler(), TrainerRequests(), 1)
    try:
        for chunk_id in range(6):
            ray.get(coordinator.get_chunk.remote(chunk_id))
        saved = ray.get(coordinator.checkpoint_state.remote(2))  # a checkpoint at chunk 2 ...
        ray.get(coordinator.release.remote(4))  # ... and a later one at 4: chunks 0-3 and their cursors go
        ray.get(coordinator.restore.remote(saved))  # the trainers roll back to the checkpoint at 2
        assert ray.get(coordinator.get_chunk.remote(2)).sample_ids == ids(2)
        report = ray.get(coordinator.report.remote())
        assert (report["stream_restarts"], report["restarts_from_cursor"], report["chunks_skipped_on_seek"]) == (1, 1, 0)
        ray.get(coordinator.get_chunk.remote(5))  # produced again through chunk 5
        assert ray.get(coordinator.get_chunk.remote(1)).sample_ids == ids(1)  # released, no cursor <= 1 left
        report = ray.get(coordinator.report.remote())
        assert (report["stream_restarts"], report["restarts_from_cursor"], report["chunks_skipped_on_seek"]) == (2, 1, 1)
        assert report["served"][1] == 2 and report["served"][2] == 2
    finally:
        ray.kill(coordinator)
