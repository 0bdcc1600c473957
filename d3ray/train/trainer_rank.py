"""One trainer rank as one value: its DeepSpeed engine, its rank, the number of ranks, the ZeRO stage.

Every function of the trainers that gathers, shards or reduces needs the same four facts about the rank it
runs on (a ZeRO-3 snapshot is gathered by all ranks, rank 0 hands it on; the drift potential's batches are
split ``rank, rank + W, ...``). They travel together as a :class:`TrainerRank`, built once per worker by the
training loop (d3ray/train/engine.py), instead of four arguments through every signature.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["TrainerRank"]


@dataclass(frozen=True)
class TrainerRank:
    """This process's place among the trainers.

    Attributes:
        engine: the rank's DeepSpeed engine (``engine.module`` is the model; under ZeRO-3 its parameters
            are shards).
        rank: this rank, ``0 <= rank < world``.
        world: the number of trainer ranks (``train.num_workers``).
        zero_stage: ``train.zero_stage`` (how parameters and optimizer state are spread over the ranks).
    """

    engine: Any
    rank: int
    world: int
    zero_stage: int

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world:
            raise ValueError(f"rank {self.rank} is not one of the {self.world} trainer ranks")
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_stage={self.zero_stage} must be 0, 1, 2 or 3")

    @property
    def is_rank0(self) -> bool:
        """Whether this rank writes the run's logs and talks to the coordinator for all of them."""
        return self.rank == 0
