"""``d3ray schedulers [NAME]``: every registered scheduler with its kind, one line and its paper; with a
name, that scheduler's knobs (``--schedule.KEY=...``) with their defaults and doc lines."""

from __future__ import annotations

import argparse
import re


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("schedulers", help="list the registered schedulers (order, select, weight, mix); "
                                   "with NAME, that scheduler's knobs")
    parser.add_argument("name", nargs="?", help="a scheduler: print its knobs, defaults and doc lines")
    parser.set_defaults(func=run)


def rows() -> list[tuple[str, str, str, str]]:
    """(name, kind, first line of the docstring, paper) of every registered scheduler, by kind then name."""
    import d3ray.schedule  # noqa: F401  (registers the built-ins)
    from d3ray.schedule.config import ScheduleConfig

    out = []
    for name in ScheduleConfig.known():
        cls = ScheduleConfig.lookup(name)
        doc = re.split(r"(?<!et al)\.\s", " ".join((cls.__doc__ or "").split()))[0].rstrip(".") + "."
        out.append((name, str(cls.kind), doc, cls.paper or "-"))
    return sorted(out, key=lambda r: (r[1], r[0]))


def run(args: argparse.Namespace) -> int:
    if getattr(args, "name", None):
        return print_knobs(args.name)
    for name, kind, doc, paper in rows():
        print(f"{name:<16} {kind:<7} {doc}")
        print(f"{'':<16} {'':<7} paper: {paper}")
    return 0


def print_knobs(name: str) -> int:
    """One scheduler's kind, paper and knobs (``schedule.*`` keys) with defaults and doc lines."""
    import d3ray.schedule  # noqa: F401  (registers the built-ins)
    from d3ray.config_docs import describe_class
    from d3ray.errors import UserError
    from d3ray.schedule.config import ScheduleConfig

    try:
        cls = ScheduleConfig.lookup(name)
    except ValueError as err:
        raise UserError(str(err)) from None
    row = next(r for r in rows() if r[0] == name)
    print(f"{name} ({row[1]}): {row[2]}\npaper: {row[3]}\n")
    print("schedule:   # --schedule.KEY=VALUE, or under schedule: in a --config file")
    print("\n".join("  " + line for line in describe_class(cls)))
    return 0
