"""The schedule stage: chunks of the data stream → decisions (order, selection, weights) → trainers.

Importing the package registers every built-in scheduler on :class:`ScheduleConfig`.
"""

from d3ray.schedule import config as _config  # noqa: F401  (the base and the order baselines first)
from d3ray.schedule.mix import configs as _mix  # noqa: F401
from d3ray.schedule.order import configs as _order  # noqa: F401
from d3ray.schedule.order import d3 as _d3  # noqa: F401  (d3, d3_paper and D3's placements)
from d3ray.schedule.select import configs as _select  # noqa: F401
from d3ray.schedule.weight import configs as _weight  # noqa: F401
