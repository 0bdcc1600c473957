"""D3's placements, one file each (registered on import): ``actors`` and ``in_trainer``.

``schedule.placement: {type: NAME, ...}``; base.py says what a placement declares and builds.
"""

from d3ray.schedule.order.d3.placements.actors import ActorsPlacement
from d3ray.schedule.order.d3.placements.base import ChunkSubmitter, PlacementConfig
from d3ray.schedule.order.d3.placements.in_trainer import InTrainerPlacement

__all__ = ["ActorsPlacement", "ChunkSubmitter", "InTrainerPlacement", "PlacementConfig"]
