"""The scheduler's work on the trainer ranks: what ``ScheduleConfig.trainer_requests()`` asks of the trainers.

- ``trainer_side.py``: ``TrainerSide``, the one object the loop calls: version 0 before the first step,
  then per chunk its feedback (per-sample losses) and the next version's weights snapshot or scores.
- ``snapshot.py``: the weights (and AdamW state) gathered from the engine under ZeRO 0-3, in the requested
  dtype, for the object store.
- ``trainer_potential.py``: D3's potential scored on the trainers' own module (ZeRO 0-2).
- ``sharded_influence.py``: D3's sketches of the gradient slices each rank holds (ZeRO-3).

Each takes the rank as one :class:`~d3ray.train.trainer_rank.TrainerRank`; the worker (``d3ray/train/loop.py``)
builds the ``TrainerSide``.
"""
