"""Select schedulers: which samples of a candidate window of ⌈L / fraction⌉ batches train (L batches).

Configs in :mod:`d3ray.schedule.select.configs`; the shared keep-the-top-scores logic in
:mod:`d3ray.schedule.select.base`; each algorithm's scoring in its own module.
"""
