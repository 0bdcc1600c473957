"""SolverPool on a real local Ray: futures by object reference, and a crashed actor's task retried."""

from __future__ import annotations

import numpy as np
import pytest

from d3ray.solver import IlsConfig, solve
from d3ray.solver.pool import SolverPool, SolverPoolConfig, SolverWorker

pytestmark = pytest.mark.ray

CONFIG = IlsConfig(max_iters=40)


def _gaussian(K: int, seed: int) -> np.ndarray:
    A = np.random.default_rng(seed).normal(size=(K, K))
    return A - A.T


def test_solver_worker_without_ray_echoes_key() -> None:
    S = _gaussian(10, 0)
    result = SolverWorker(CONFIG).solve("chunk-3", S, seed=2)
    assert result.stats["key"] == "chunk-3"
    assert result.order.tolist() == solve(S, CONFIG, seed=2).order.tolist()


def test_solver_pool_array_ref_and_wrapped_ref_match_local_solve(ray_cluster) -> None:
    ray = ray_cluster
    problems = [_gaussian(30, seed) for seed in range(4)]
    with SolverPool(2, CONFIG, num_cpus=0.5) as pool:
        refs = [
            pool.submit(0, problems[0], seed=0),  # plain array
            pool.submit(1, ray.put(problems[1]), seed=1),  # ObjectRef, resolved by Ray
            pool.submit(2, [ray.put(problems[2])], seed=2),  # list-wrapped ref, resolved in the actor
            pool.submit(3, problems[3], init=np.arange(30)[::-1].copy(), seed=3),
        ]
        results = ray.get(refs, timeout=120)
    for key, (S, result) in enumerate(zip(problems, results, strict=True)):
        init = np.arange(30)[::-1].copy() if key == 3 else None
        assert result.stats["key"] == key
        assert result.order.tolist() == solve(S, CONFIG, init=init, seed=key).order.tolist()


def _wait_until_running(ray, method: str, timeout_s: float = 60.0) -> None:
    """Block until the State API lists a task of ``method`` as RUNNING."""
    import time

    from ray.util.state import list_tasks

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if list_tasks(filters=[("func_or_class_name", "=", method), ("state", "=", "RUNNING")]):
            return
        time.sleep(0.05)
    raise AssertionError(f"no {method} task reached RUNNING within {timeout_s}s")


def test_solver_pool_killed_actor_restarts_and_retries_task(ray_cluster) -> None:
    ray = ray_cluster
    S = _gaussian(80, 5)
    # Only the clock stops this search (4 s), so the kill below lands while the task is running.
    config = IlsConfig(max_iters=None, patience=None, time_budget_s=4.0)
    pool = SolverPoolConfig(num_actors=1, num_cpus=0.5, max_restarts=2, max_task_retries=2).build(config)
    try:
        (actor,) = pool.actors
        assert ray.get(actor.num_solved.remote(), timeout=60) == 0  # the actor is up
        ref = pool.submit("c7", ray.put(S), seed=4)
        _wait_until_running(ray, "SolverWorker.solve")
        ray.kill(actor, no_restart=False)  # crash the process in the middle of the task
        result = ray.get(ref, timeout=180)
        assert result.stats["key"] == "c7"
        assert sorted(result.order.tolist()) == list(range(80))
        assert result.cost <= result.initial_cost
        assert ray.get(actor.num_solved.remote(), timeout=60) == 1  # fresh process: only the retried task
    finally:
        pool.shutdown()
