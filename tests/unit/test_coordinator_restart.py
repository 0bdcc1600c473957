"""The producer's stream restart when a chunk was restored without a data cursor (an arm branched from a
trunk whose stream it does not share: ``compare/trunk.py`` hands it ``{"chunk_id": K, "cursor": None}``)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from d3ray.schedule.coordinator.decide import CoordinatorState
from d3ray.schedule.coordinator.mailbox import Mailbox
from d3ray.schedule.coordinator.producer import ChunkProducer, SubmitInputs


class CountingStream:
    """Chunks 0, 1, 2, ... from the start (a cursor is ignored: none is ever given here)."""

    def __iter__(self):
        return (SimpleNamespace(chunk_id=i, cursor=None) for i in range(100))

    def close(self) -> None:
        pass


def producer(made: list) -> ChunkProducer:
    def make_stream(cursor=None):
        made.append(cursor)
        return CountingStream()

    return ChunkProducer(make_stream, scheduler=None, scheduler_lock=threading.Lock(),
                         mailbox=Mailbox(threading.Condition()), inputs=SubmitInputs(), decided=lambda c: False,
                         state=CoordinatorState(), prefetch_chunks=2, staleness=1, deadline_s=None)


def test_a_chunk_restored_without_a_cursor_is_reached_by_reading_from_chunk_0():
    made: list = []
    p = producer(made)
    p.cursors[30] = None  # what ScheduleCoordinator.restore records for a branch without a cursor
    p._restart_stream(30)
    assert made == [None] and p.next_id == 30
    assert next(p._iter).chunk_id == 30  # 30 chunks skipped: the next one read is the one asked for
    assert p._state.chunks_skipped_on_seek == 30 and p._state.restarts_from_cursor == 0


def test_a_second_rank_asking_for_the_chunk_being_sought_does_not_seek_again():
    """Two trainer ranks resumed from a checkpoint both ask for its chunk; the second ask arrives while the
    producer restarts the stream for the first. It must not queue a second restart: one re-read the chunk
    after a checkpoint had released its decision and waited for its influence for ever (a hang seen in
    the in-trainer kill-while-scoring test)."""
    made: list = []
    p = producer(made)
    p.next_id = 4  # the producer had reached chunk 4 before the trainers failed
    with p.cond:
        p.request(1)  # rank 0 resumes at chunk 1, released before: a seek
        assert p._seek_to == 1
        assert p._take_seek() == 1  # the producer thread takes it ...
        p.request(1)  # ... and rank 1's ask for the same chunk arrives during the restart
        assert p._seek_to is None
        p.request(0)  # an earlier chunk still seeks
        assert p._seek_to == 0


def test_a_request_produces_ahead_but_not_past_the_run_s_last_chunk():
    p = producer([])
    with p.cond:
        p.request(3)  # no bound given: prefetch_chunks (2) ahead
        assert p._wanted == 5
        p.request(4, through=5)  # the run's last chunk is 5: nothing past it
        assert p._wanted == 5
        p.request(8, through=5)  # a chunk asked for is produced whatever the bound said
        assert p._wanted == 8
