"""``d3ray sweep``: run (or resume) a Ray Tune sweep over whole training runs.

    d3ray sweep --config tune_configs/k_L_gamma.yaml [--resume] [--max_concurrent_trials=2 ...]

Dotted overrides change the sweep file's values, the search space included
(``--space.train.steps=40``, ``--space.schedule.L='{grid: [4, 8]}'``).
"""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "sweep",
        help="Ray Tune sweep over training runs (search space in YAML, ASHA on validation loss)",
        description="Run a sweep: every trial is a whole training run with the trial's dotted config keys "
        "(see tune_configs/ and d3ray/tune/README.md). Re-running the same sweep name resumes it. "
        "Dotted overrides follow: --max_concurrent_trials=2 --space.train.steps=40.",
    )
    parser.add_argument("--config", required=True, help="sweep YAML (see tune_configs/)")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="resume the sweep of this name (an error if there is none); without it, an existing sweep "
        "is resumed and a new one started",
    )
    parser.set_defaults(func=run, accepts_overrides=True)


def run(args: argparse.Namespace) -> int:
    from d3ray.config_loading import load_config
    from d3ray.tune.config import SweepConfig
    from d3ray.tune.sweep import run_sweep

    sweep = load_config(SweepConfig, args.config, args.overrides)
    outcome = run_sweep(sweep, resume=True if args.resume else None)
    return 0 if outcome.finished and outcome.best is not None else 1
