"""``d3ray compare --config FILE``: every arm × seed at equal tokens, then the report.

    d3ray compare --config jobs/configs/compare_pretrain_tiny.yaml [--only-arms random,d3] [--seeds='[0, 1]']
        [--report-only] [--dry-run]

Dotted overrides change the comparison file's values (``--seeds='[0]' --output_dir=/tmp/c``).
Re-running the same command skips the finished runs and redoes the report.
"""

from __future__ import annotations

import argparse
import shlex


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "compare",
        help="compare schedulers: arms × seeds at equal training tokens, report with paired tests",
        description="Run every arm × seed of a comparison file (see d3ray/lab/compare/README.md) at equal training "
        "tokens, skipping finished runs, then write <output_dir>/report/ (results.md, results.csv, PNGs). "
        "Dotted overrides follow: --seeds='[0, 1]' --max_concurrent_runs=4.",
    )
    parser.add_argument("--config", required=True, help="comparison YAML (see jobs/configs/compare_*.yaml)")
    parser.add_argument("--report-only", action="store_true", help="run nothing; report on the runs there are")
    parser.add_argument("--dry-run", action="store_true", help="build and check every run's config, print the plan")
    parser.add_argument("--only-arms", default=None, metavar="A,B,...",
                        help="run (and report) only these arms of the file, e.g. random,random-aa,d3; a later run "
                             "with more arms skips the finished ones (the baseline arm must be among them)")
    parser.set_defaults(func=run, accepts_overrides=True)


def run(args: argparse.Namespace) -> int:
    from d3ray.config_loading import load_config
    from d3ray.lab.compare.config import CompareConfig
    from d3ray.lab.compare.grid import outcomes_on_disk, run_grid
    from d3ray.lab.compare.plan import build_plan
    from d3ray.run_files import is_finished

    cfg = load_config(CompareConfig, args.config, args.overrides)
    if args.only_arms:
        cfg = cfg.only_arms([a.strip() for a in args.only_arms.split(",") if a.strip()])
    plan = build_plan(cfg)
    if args.dry_run:
        for seed, trunk in plan.trunks.items():
            state = "finished" if is_finished(trunk.run_dir) else "to run"
            print(f"{trunk.name:<32} {state} (trunk of seed {seed}: {plan.trunk_steps} steps, every arm starts there)")
        for spec in plan.runs:
            state = "finished" if is_finished(spec.run_dir) else ("cannot be built" if spec.config is None else "to run")
            print(f"{spec.name:<32} {state}{': ' + spec.error if spec.error else ''}")
        return 0
    outcomes = outcomes_on_disk(plan) if args.report_only else run_grid(plan)
    arms = ["--only-arms", args.only_arms] if args.only_arms else []
    command = " ".join(shlex.quote(a) for a in ["d3ray", "compare", "--config", args.config, *arms, *args.overrides])
    from d3ray.lab.compare.report import write_report

    report = write_report(plan, outcomes, command)
    print(f"report: {report['dir'] / 'results.md'}")
    return 0 if all(o.ok for o in outcomes) else 1

