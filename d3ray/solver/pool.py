"""A pool of solver actors: S in (by object reference), a future of the order out.

The schedule coordinator (docs/design/system.md §2) solves chunk c+1 while the trainers train chunk c.
``SolverPool.submit`` returns immediately with an ``ObjectRef[SolveResult]``; the pipeline ``ray.get``s
it (with its own deadline) when it needs the order.

    S (ray.put, or array) ──submit(key, S)──► least-busy SolverWorker actor ──► ObjectRef[SolveResult]
                                               (restarted + task retried if its process dies)

Fault tolerance is Ray's: actors are created with ``max_restarts`` and ``max_task_retries``, so a call
in flight on an actor whose process dies is re-run on the restarted actor (docs/design/ray.md §4).
Solving is a pure function of (S, init, seed, config), so a retry returns the same order unless a
wall-clock ``time_budget_s`` binds.

``SolverWorker`` is a plain class (unit tests call it without Ray); it is wrapped with ``ray.remote``
only here, where the actors are created. Ray is imported lazily so that importing this module is cheap.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from d3ray import faults
from d3ray.solver.base import SolverConfig, SolveResult

if TYPE_CHECKING:
    from ray import ObjectRef
    from ray.actor import ActorHandle

logger = logging.getLogger(__name__)

__all__ = ["SolverPool", "SolverPoolConfig", "SolverWorker"]


class SolverWorker:
    """Holds one built solver; the body of a solver actor.

    Args:
        config: the solver to build.
        run_dir: the run directory (its fault drills act through ``d3ray.faults.inject``), or None.
    """

    def __init__(self, config: SolverConfig, run_dir: str | None = None) -> None:
        self.config = config
        self.run_dir = run_dir
        self.solver = config.build()
        # Compile (or load from numba's disk cache) the solver's kernels now, not on the first chunk.
        warm = np.arange(16.0).reshape(4, 4)
        self.solver.solve(warm - warm.T)
        self.solved = 0

    def solve(self, key: Any, S: Any, init: np.ndarray | None = None, seed: int = 0) -> SolveResult:
        """Solve one S; ``key`` (e.g. the chunk id) is echoed in ``stats["key"]``.

        Args:
            key: caller's identifier of the problem.
            S: (K, K) array, or ``[ObjectRef]`` (a list-wrapped reference, resolved here).
            init: (K,) initial order.
            seed: solver seed.
        """
        faults.inject(self.run_dir, "solve", key=key)
        if isinstance(S, list):
            import ray

            (S,) = ray.get(S)
        result = self.solver.solve(S, init=init, seed=seed)
        self.solved += 1
        return dataclasses.replace(result, stats={**result.stats, "key": key})

    def num_solved(self) -> int:
        """Problems solved since this process started (resets when the actor restarts)."""
        return self.solved


@dataclass(frozen=True, kw_only=True)
class SolverPoolConfig:
    """Resources and fault tolerance of a :class:`SolverPool`."""

    num_actors: int = 1
    """Number of solver actors."""
    num_cpus: float = 1.0
    """CPUs reserved per actor."""
    resources: dict[str, float] = field(default_factory=dict)
    """Custom resources per actor, e.g. {"cpu_node": 0.01} to pin solvers to CPU nodes."""
    max_restarts: int = 2
    """Times Ray recreates a crashed actor (-1: forever)."""
    max_task_retries: int = 2
    """Times a call in flight on a crashed actor is retried on the restarted one (-1: forever)."""

    def __post_init__(self) -> None:
        if self.num_actors < 1:
            raise ValueError(f"solver_pool.num_actors must be >= 1, got {self.num_actors!r}")
        if not self.num_cpus >= 0:
            raise ValueError(f"solver_pool.num_cpus must be >= 0, got {self.num_cpus!r}")
        if self.max_restarts < -1:
            raise ValueError(f"solver_pool.max_restarts must be >= -1, got {self.max_restarts!r}")
        if self.max_task_retries < -1:
            raise ValueError(f"solver_pool.max_task_retries must be >= -1, got {self.max_task_retries!r}")

    def build(
        self,
        solver: SolverConfig,
        run_dir: str | None = None,
    ) -> SolverPool:
        return SolverPool(
            self.num_actors,
            solver,
            num_cpus=self.num_cpus,
            resources=dict(self.resources),
            max_restarts=self.max_restarts,
            max_task_retries=self.max_task_retries,
            run_dir=run_dir,
        )


class SolverPool:
    """``num_actors`` SolverWorker actors; ``submit`` sends each problem to the least busy one.

    Needs ``ray.init`` first. Use as a context manager or call :meth:`shutdown`.

    Args:
        num_actors: number of actors.
        config: solver every actor builds.
        num_cpus: CPUs per actor.
        resources: custom resources per actor.
        max_restarts: actor restarts after a crash.
        max_task_retries: retries of an in-flight call after a crash (default: as many as restarts).
        run_dir: the run directory the actors' fault drills read (``d3ray.faults``), or None.
    """

    def __init__(
        self,
        num_actors: int,
        config: SolverConfig,
        num_cpus: float = 1.0,
        resources: dict[str, float] | None = None,
        max_restarts: int = 2,
        max_task_retries: int | None = None,
        run_dir: str | None = None,
    ) -> None:
        import ray

        retries = max_restarts if max_task_retries is None else max_task_retries
        SolverPoolConfig(  # validates the numbers
            num_actors=num_actors, num_cpus=num_cpus, max_restarts=max_restarts, max_task_retries=retries
        )
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        remote_cls = ray.remote(SolverWorker).options(
            num_cpus=num_cpus,
            resources=dict(resources or {}),
            max_restarts=max_restarts,
            max_task_retries=retries,
            # Own resources, never a Tune trial's placement group (which holds only its driver).
            scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=None),
        )
        self.config = config
        self._actors: list[ActorHandle] = [
            remote_cls.remote(config, None if run_dir is None else str(run_dir)) for _ in range(num_actors)
        ]
        self._in_flight: list[list[ObjectRef]] = [[] for _ in range(num_actors)]
        self._next = 0
        logger.info(
            "solver pool: %d x %s actors (%.2g CPU each, max_restarts=%d)",
            num_actors,
            getattr(config, "type_name", type(config).__name__),
            num_cpus,
            max_restarts,
        )

    @property
    def actors(self) -> list[ActorHandle]:
        """The actor handles (for monitoring; solving goes through :meth:`submit`)."""
        return list(self._actors)

    def submit(self, key: Any, S: Any, init: np.ndarray | None = None, seed: int = 0) -> ObjectRef:
        """Queue one problem; returns at once with an ``ObjectRef[SolveResult]``.

        Args:
            key: the caller's id of the problem (echoed in ``stats["key"]``).
            S: (K, K) array, an ``ObjectRef`` to one, or ``[ObjectRef]`` (resolved in the actor).
            init: (K,) initial order.
            seed: solver seed.
        """
        import ray

        if not self._actors:
            raise RuntimeError("SolverPool.submit after shutdown()")
        for i, refs in enumerate(self._in_flight):
            if refs:
                _, self._in_flight[i] = ray.wait(refs, num_returns=len(refs), timeout=0)
        loads = [len(refs) for refs in self._in_flight]
        n = len(self._actors)
        # least busy; ties go round-robin so idle actors share the work
        idx = min(range(n), key=lambda i: (loads[(self._next + i) % n], i))
        idx = (self._next + idx) % n
        self._next = (idx + 1) % n
        ref = self._actors[idx].solve.remote(key, S, init, seed)
        self._in_flight[idx].append(ref)
        return ref

    def shutdown(self) -> None:
        """Kill the actors (results already computed stay readable)."""
        import ray

        for actor in self._actors:
            ray.kill(actor, no_restart=True)
        self._actors = []
        self._in_flight = []

    def __enter__(self) -> SolverPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
