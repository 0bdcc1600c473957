"""The ``d3ray`` command line: one sub-command per user task.

    d3ray pretrain [--config FILE.yaml] [--train.steps=200 ...]
    d3ray config show [--config FILE.yaml] [--finetune] [--schedule.L=16 ...]
    d3ray schedulers [NAME]
    d3ray sweep --config tune_configs/k_L_gamma.yaml
    d3ray compare --config jobs/configs/compare_pretrain_tiny.yaml
    d3ray solve MATRIX_FILE [--solver NAME] [--time-budget S] [--seed N]
    d3ray data sample --out DIR | d3ray data inspect PATH | d3ray data sft-sample --out DIR
    d3ray export CHECKPOINT --out DIR [--lora merged|adapter]
    d3ray eval MODEL_OR_CHECKPOINT --tasks KIND=FILE[,KIND=FILE...] --out results.json
    d3ray bench {solver,influence,pipeline} --out FILE.json
    d3ray plot schedule RUN_DIR
    d3ray doctor

Each stage package owns its sub-commands in a ``command.py`` whose ``register(subparsers)``
adds a parser with ``func=handler``; handlers import heavy modules (torch, ray) lazily so that
``d3ray --help`` stays instant. This is the only module that configures logging.

A :class:`~d3ray.errors.UserError` (a bad config key or value, a missing path, data over its
bad-record limit) prints as ``d3ray COMMAND: error: ...`` and exits 2; ``--debug`` (anywhere on the
line) shows its traceback too. Any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import re
import sys

# Modules that contribute sub-commands, in help order. A module may register several.
COMMAND_MODULES = (
    "d3ray.run.command",
    "d3ray.config_docs",
    "d3ray.schedule.command",
    "d3ray.tune.command",
    "d3ray.lab.compare.command",
    "d3ray.lab.census.command",
    "d3ray.solver.command",
    "d3ray.data.command",
    "d3ray.export.command",
    "d3ray.eval.command",
    "d3ray.lab.bench.command",
    "d3ray.plot.command",
    "d3ray.doctor",
)


DOTTED_OVERRIDE = re.compile(r"^--\w+(\.\w+)+=")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="d3ray", description=__doc__.split("\n\n")[0])
    parser.add_argument("--log-level", default="WARNING",
                        help="console logging level (default WARNING; runs log INFO to <run_dir>/logs/)")
    parser.add_argument("--debug", action="store_true", help="show tracebacks of user errors too")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


class ConsoleHandler(logging.StreamHandler):
    """The console: writes to whatever ``sys.stderr`` is when a record is emitted (not the stream of the
    moment it was made), so a caller that swaps ``sys.stderr`` (a test capturing output, a notebook) never
    leaves logging a closed stream."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):  # noqa: D102
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def configure_logging(level: str) -> None:
    """Console handler at ``level`` (one, however often ``main`` runs in a process); the root logger at
    INFO so that run log files get INFO too."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, ConsoleHandler)]:
        root.removeHandler(old)
    handler = ConsoleHandler()
    handler.setLevel(getattr(logging, level.upper(), logging.WARNING))
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S"))
    root.addHandler(handler)
    root.setLevel(min(handler.level, logging.INFO))


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line → the command's namespace; ``args.overrides`` holds the dotted config overrides:
    those a command parses itself (a positional ``overrides``) and the unparsed ``--key=value``s."""
    parser = build_parser()
    # argparse reads a "--key=value" holding a space ("--train.betas=[0.0, 0.95]") as a positional: a
    # dotted override is never an option, so it is set aside before parsing, whatever its value.
    dotted = [a for a in argv if DOTTED_OVERRIDE.match(a)]
    args, extra = parser.parse_known_args([a for a in argv if not DOTTED_OVERRIDE.match(a)])
    extra += dotted
    if extra and not getattr(args, "accepts_overrides", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.overrides = list(getattr(args, "overrides", None) or []) + extra
    return args


def main(argv: list[str] | None = None) -> int:
    from d3ray.errors import UserError

    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    args = parse_args([a for a in argv if a != "--debug"])
    configure_logging(args.log_level)
    try:
        result = args.func(args)
    except UserError as err:
        if debug:
            raise
        print(f"d3ray {args.command}: error: {err}\n(add --debug for the traceback)", file=sys.stderr)
        return 2
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
