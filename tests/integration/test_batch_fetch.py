"""Rank 0's fetch of the batches to score, a chunk ahead (d3ray/train/scheduling/batch_fetch.py), against a
real Ray actor answering ``sketch_request`` as the coordinator does: refs and ids once the chunk is offered
(it waits until then), None for a chunk that needs no scoring."""

import time

import pytest

from d3ray.train.scheduling.batch_fetch import BatchFetcher
from tests.conftest import start_local_ray
from tests.fakes import SketchOffers

pytestmark = pytest.mark.ray


def test_batches_fetched_ahead_are_the_ones_fetched_at_the_boundary_and_errors_reach_the_boundary():
    ray = start_local_ray()
    coordinator = ray.remote(SketchOffers).options(max_concurrency=4).remote()
    try:
        ray.get(coordinator.offer.remote(1, [[1, 2], [3, 4]]))
        ray.get(coordinator.offer.remote(2, None))  # decided (restored) or scored already
        fetcher = BatchFetcher(coordinator)
        assert fetcher.take(1) == ([[1, 2], [3, 4]], [100, 101])  # nothing ahead: fetched now
        fetcher.ahead([2, 3])  # chunk 3 is not offered yet: its fetch waits in its thread
        time.sleep(0.2)
        assert fetcher.take(2) is None
        ray.get(coordinator.offer.remote(3, [[5, 6]]))  # offered while the chunk before trains
        assert fetcher.take(3) == ([[5, 6]], [300])
        assert fetcher.take(3) == ([[5, 6]], [300])  # taken once ahead, then asked again: the same answer
        fetcher.ahead([-1])
        with pytest.raises(ray.exceptions.RayTaskError, match="no chunk -1"):  # raised where it is taken
            fetcher.take(-1)
    finally:
        ray.kill(coordinator)
