"""``d3ray pretrain``: run (or resume) a pre-training job on a local or existing Ray cluster."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "pretrain",
        help="pre-train a causal LM with a data scheduler (default: tiny GPT-2, random order, sample data)",
        description="Run a pre-training job. Without --config, the tiny default runs on generated sample "
        "data. Dotted overrides follow: --train.steps=200 --schedule.type=d3.",
    )
    parser.add_argument("--config", help="values-only YAML file (see jobs/configs/)")
    parser.set_defaults(func=run, accepts_overrides=True)


def run(args: argparse.Namespace) -> int:
    from d3ray.config import RunConfig
    from d3ray.config_loading import load_config
    from d3ray.train.run import run_pretrain

    cfg = load_config(RunConfig, args.config, args.overrides)
    run_pretrain(cfg)
    return 0
