"""Schedule configs: which scheduler orders each chunk, the chunk length L, the look-ahead.

Selected in YAML by ``schedule: {type: random | sequential | d3, L: 60, ...}``. The built-ins
are registered when ``d3ray.schedule`` is imported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from d3ray.influence.config import InfluenceConfig
from d3ray.registry import ChoiceConfig
from d3ray.solver import IlsConfig, SolverConfig
from d3ray.solver.pool import SolverPoolConfig


@dataclass(frozen=True, kw_only=True)
class ScheduleConfig(ChoiceConfig):
    """Common fields of every scheduler."""

    L: int = 8
    """Chunk length: consecutive global batches ordered together (the paper: 60)."""
    prefetch_chunks: int = 2
    """Ordered chunks prepared ahead of the trainers (bounded queue)."""
    shuffle_buffer: int = 0
    """Seeded streaming shuffle of packed sequences before batching (0 = stream order)."""

    def __post_init__(self) -> None:
        if self.L < 1:
            raise ValueError(f"schedule.L={self.L} must be >= 1")
        if self.prefetch_chunks < 1:
            raise ValueError(f"schedule.prefetch_chunks={self.prefetch_chunks} must be >= 1")
        if self.shuffle_buffer < 0:
            raise ValueError(f"schedule.shuffle_buffer={self.shuffle_buffer} must be >= 0")


@ScheduleConfig.register("sequential")
@dataclass(frozen=True, kw_only=True)
class SequentialScheduleConfig(ScheduleConfig):
    """Batches in stream order (no reordering)."""


@ScheduleConfig.register("random")
@dataclass(frozen=True, kw_only=True)
class RandomScheduleConfig(ScheduleConfig):
    """A seeded uniform random permutation of each chunk: the baseline."""


@ScheduleConfig.register("d3")
@dataclass(frozen=True, kw_only=True)
class D3ScheduleConfig(ScheduleConfig):
    """D3: order each chunk by sketched second-order influence (Xu et al. 2026, §3)."""

    staleness: int = 1
    """1: chunk c+1 is scored at the weights published when chunk c started (async, overlapped);
    0: at the weights after chunk c (the trainers wait for it)."""
    deadline_s: float = 120.0
    """How long the trainers wait for an order past the moment they need it; then the fallback."""
    influence: InfluenceConfig = field(default_factory=InfluenceConfig)
    """Estimator, sketch, γ and cost knobs (sample_fraction, param_filter)."""
    solver: SolverConfig = field(default_factory=IlsConfig)
    """Ordering solver (``type: ils | rsr | row_sum | greedy_insertion | exact``)."""
    solver_seed: int = 0
    """Seed of the solver (combined with the chunk id)."""
    solver_pool: SolverPoolConfig = field(default_factory=lambda: SolverPoolConfig(num_cpus=0.25))
    """Solver actors: count, CPUs, custom resources (pin to CPU nodes), restarts."""
    influence_actors: int = 1
    """InfluenceWorker actors; a chunk's batches are split across them."""
    influence_num_cpus: float = 1.0
    """CPUs per influence actor."""
    influence_num_gpus: float = 0.0
    """GPUs per influence actor (fractional allowed, e.g. 0.25 to share a GPU with a trainer)."""
    influence_resources: dict[str, float] = field(default_factory=dict)
    """Custom resources per influence actor (e.g. {"gpu_node": 0.01})."""
    influence_max_restarts: int = 2
    """Restarts of a crashed influence actor (its in-flight task is retried on the new one)."""
    influence_nice: int = 0
    """OS niceness (0-19) influence actors run at, at least: raised to it, never lowered (Ray starts its
    workers, trainers included, at 15). On CPU nodes shared with the trainers, 19 gives the trainers
    the larger share of the cores: influence latency grows (hidden by staleness 1) and the training
    steps it overlaps slow down less; 0 leaves Ray's value."""
    save_matrices: bool = True
    """Keep each chunk's S in the decision (rank 0 saves it under ``<run_dir>/influence/``)."""
    crash_influence_at_chunk: int | None = None
    """Fault injection for tests and drills: influence actor 0 exits (once) when asked to score this chunk."""
    crash_solver_at_chunk: int | None = None
    """Fault injection for tests and drills: the solver actor exits (once) when asked to order this chunk."""
    inject_nan_batches: list[int] = field(default_factory=list)
    """Fault injection for tests and drills: global batch ids whose influence copy has every
    label masked, which makes its loss NaN (the batch must be excluded, not the chunk lost)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.staleness not in (0, 1):
            raise ValueError(f"schedule.staleness={self.staleness} must be 0 or 1")
        if not self.deadline_s > 0:
            raise ValueError(f"schedule.deadline_s={self.deadline_s} must be > 0")
        if not 0 <= self.influence_nice <= 19:
            raise ValueError(f"schedule.influence_nice={self.influence_nice} must be in 0..19")
        if self.influence_actors < 1:
            raise ValueError(f"schedule.influence_actors={self.influence_actors} must be >= 1")

    def build(self, seed: int, model_config: dict[str, Any], run_config: Any = None, **_: Any):
        """The D3Scheduler with its influence actors and solver pool (needs ``ray.init``)."""
        from d3ray.schedule.d3 import D3Scheduler

        return D3Scheduler(self, seed, model_config, run_name=getattr(run_config, "name", "d3ray"),
                           fault_dir=str(run_config.run_dir / ".faults") if run_config is not None else None)
