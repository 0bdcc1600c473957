"""Schedule configs: which scheduler orders each chunk, the chunk length L, the look-ahead.

Selected in YAML by ``schedule: {type: random | sequential | d3, L: 60, ...}``. The built-ins
are registered when ``d3ray.schedule`` is imported.
"""

from __future__ import annotations

from dataclasses import dataclass

from d3ray.registry import ChoiceConfig


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
