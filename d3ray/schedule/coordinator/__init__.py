"""The schedule coordinator: one threaded actor per run that turns the data stream into decided chunks.

    actor.py     ScheduleCoordinator: the remote methods (get_chunk, feedback, publish_weights,
                 sketch_request, publish_influence, checkpoint_state, restore, release, report, error)
                 and the decisions made or restored
    mailbox.py   what the trainers send (weight snapshots by version, feedback by chunk, in-trainer
                 sketches) and the waits for it
    producer.py  the producer thread: stream → ray.put → submit → slots, bounded prefetch, seek/restart
    decide.py    pure: a chunk and its decision (or fallback) → the DecidedChunk served, accounting

The diagram of the whole is in ``actor.py``'s docstring and ``d3ray/schedule/README.md``.
"""

from d3ray.schedule.coordinator.actor import ScheduleCoordinator
from d3ray.schedule.coordinator.decide import CoordinatorState, DecidedChunk

__all__ = ["CoordinatorState", "DecidedChunk", "ScheduleCoordinator"]
