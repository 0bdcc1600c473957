"""``d3ray compare``: schedulers × seeds at equal training tokens, with total compute, and an honest report.

Public API::

    from d3ray.lab.compare import CompareConfig, ArmConfig, build_plan, run_grid, write_report
    plan = build_plan(cfg)                 # every run's RunConfig, checked (no Ray)
    outcomes = run_grid(plan)              # runs the unfinished ones, records failures
    write_report(plan, outcomes)           # <output_dir>/report/results.md, results.csv, runs.csv, PNGs
"""

from d3ray.lab.compare.config import ArmConfig, CompareConfig
from d3ray.lab.compare.grid import RunOutcome, run_grid
from d3ray.lab.compare.plan import ComparePlan, RunSpec, build_plan
from d3ray.lab.compare.report import write_report

__all__ = ["ArmConfig", "CompareConfig", "ComparePlan", "RunOutcome", "RunSpec", "build_plan", "run_grid",
           "write_report"]
