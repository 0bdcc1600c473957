"""Rank 0's fetch of the batches the trainers score, started a chunk ahead.

At a chunk boundary the trainers' own scoring (``trainer_side.sketch_due_chunks``) needs the batches of the
chunks due at the new weights version: rank 0 asks the coordinator for them (``sketch_request``: the refs and
global batch ids, or None when the chunk needs no scoring any more) and fetches them from the object store,
while the other ranks wait for its broadcast. Done at the boundary, that round trip was a fifth of the
default D3's boundary on the 2-core box (docs/results/bench-pipeline-default-d3-2026-12-05.md). The chunks
due at the next boundary are known one boundary earlier, and the coordinator offers them while the chunk
before trains, so :class:`BatchFetcher` asks in a thread as soon as a boundary's scoring is done, and the
next boundary finds the batches here.

What is fetched ahead is what the boundary would fetch: the answer for a chunk does not change in between
(a chunk becomes decided or scored only through these trainers' own scoring, or a restore, which starts a new
process), so the scores, and the orders, are those of the fetch at the boundary.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["BatchFetcher", "Fetched"]

Fetched = tuple[list, list[int]] | None
"""(the batches, their global batch ids) of a chunk to score, or None: it needs no scoring."""


class _Ahead:
    """One fetch running in a daemon thread (a fetch for a chunk that is never offered, e.g. past the run's
    end, must not keep the worker process from exiting)."""

    def __init__(self, fetch: Any, chunk_id: int) -> None:
        self._done = threading.Event()
        self._value: Fetched = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fetch, chunk_id), daemon=True,
                                        name=f"d3ray-fetch-chunk-{chunk_id}")
        self._thread.start()

    def _run(self, fetch: Any, chunk_id: int) -> None:
        try:
            self._value = fetch(chunk_id)
        except BaseException as err:  # re-raised where the boundary takes the result
            self._error = err
        finally:
            self._done.set()

    def result(self) -> Fetched:
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value


class BatchFetcher:
    """Rank 0's batches to score: :meth:`ahead` starts fetching chunks, :meth:`take` returns a chunk's
    (waiting for a fetch started ahead, or fetching it now).

    Args:
        coordinator: the ScheduleCoordinator actor handle.
    """

    def __init__(self, coordinator: Any) -> None:
        self.coordinator = coordinator
        self._ahead: dict[int, _Ahead] = {}

    def ahead(self, chunk_ids: list[int]) -> None:
        """Start fetching these chunks now (each once)."""
        for chunk_id in chunk_ids:
            if chunk_id not in self._ahead:
                self._ahead[chunk_id] = _Ahead(self.fetch, chunk_id)

    def take(self, chunk_id: int) -> Fetched:
        """Chunk ``chunk_id``'s batches and ids (None: it needs no scoring), fetched ahead or now."""
        ahead = self._ahead.pop(chunk_id, None)
        return ahead.result() if ahead is not None else self.fetch(chunk_id)

    def fetch(self, chunk_id: int) -> Fetched:
        """Ask the coordinator for the chunk's refs and ids (waits until it is produced), then its batches."""
        import ray

        asked = ray.get(self.coordinator.sketch_request.remote(chunk_id))
        if asked is None:
            return None
        refs, batch_ids = asked
        return ray.get(list(refs)), list(batch_ids)
