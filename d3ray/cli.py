"""The ``d3ray`` command line: one sub-command per user task.

    d3ray pretrain [--config FILE.yaml] [--train.steps=200 ...]
    d3ray sweep --config tune_configs/k_L_gamma.yaml
    d3ray solve MATRIX_FILE [--solver NAME] [--time-budget S] [--seed N]
    d3ray data sample --out DIR | d3ray data inspect PATH | d3ray data sft-sample --out DIR
    d3ray export CHECKPOINT --out DIR [--lora merged|adapter]
    d3ray eval MODEL_OR_CHECKPOINT --tasks KIND=FILE[,KIND=FILE...] --out results.json
    d3ray bench {solver,influence,pipeline} --out FILE.json
    d3ray plot schedule RUN_DIR

Each stage package owns its sub-commands in a ``command.py`` whose ``register(subparsers)``
adds a parser with ``func=handler``; handlers import heavy modules (torch, ray) lazily so that
``d3ray --help`` stays instant. This is the only module that configures logging.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

# Modules that contribute sub-commands, in help order. A module may register several.
COMMAND_MODULES = (
    "d3ray.train.command",
    "d3ray.tune.command",
    "d3ray.solver.command",
    "d3ray.data.command",
    "d3ray.export.command",
    "d3ray.eval.command",
    "d3ray.bench.command",
    "d3ray.plot.command",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="d3ray", description=__doc__.split("\n\n")[0])
    parser.add_argument("--log-level", default="INFO", help="Python logging level (default INFO)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name == name:  # that stage has no commands yet
                continue
            raise
        module.register(sub)
    return parser


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "accepts_overrides", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.overrides = extra
    configure_logging(args.log_level)
    result = args.func(args)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
