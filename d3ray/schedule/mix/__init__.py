"""Domain mixers: schedulers of kind ``mix`` that decide the domain mixture each chunk is drawn with.

Configs register in :mod:`d3ray.schedule.mix.configs` (cheap to import; the base and ``static`` in
``base_configs.py``); each algorithm has its module
(``static.py``: static and random, ``odm.py``, ``doremi.py``, ``regmix.py``), ``base.py`` wraps a mixer
and its ``order`` scheduler into one scheduler, ``domains.py`` resolves and checks the domains before
Ray starts, ``prerun.py`` runs what a mixer needs before the main run (a reference model, proxy runs).
See d3ray/schedule/README.md, "Mixers".
"""
