"""Order schedulers: in which order a chunk's batches train (D3, curricula, mtl, random, sequential).

Configs live in :mod:`d3ray.schedule.order.configs` (cheap to import: registering them must not
import torch); each scheduler lives in its own module and is imported by its config's ``build``. D3 is a
package of its own, :mod:`d3ray.schedule.order.d3` (config, presets, placements, scheduler).
"""
