"""The lab: instruments that study the product, apart from it.

``compare`` (scheduler comparisons over whole runs: arms, seeds, paired statistics), ``census`` (every
order of a chunk branched from a checkpoint: what the order is worth) and ``bench`` (the micro- and
pipeline benchmarks behind ``d3ray bench``). They run the product (its configs, trainers and
schedulers) and read its run directories; the product never imports them (tests/unit/test_import_structure.py
fails on any import from a product module into ``d3ray.lab``). The questions the studies ask of a
schedule config live here too (``d3ray/lab/schedule_questions.py``), not on the configs.

The command line (``d3ray/cli.py``) is the front door above both: ``d3ray compare``, ``d3ray census``
and ``d3ray bench ...`` load these commands by name.
"""
