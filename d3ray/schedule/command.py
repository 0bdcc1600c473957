"""``d3ray schedulers``: every registered scheduler with its kind, one line and its paper."""

from __future__ import annotations

import argparse
import re


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("schedulers", help="list the registered schedulers (order, select, weight, mix)")
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
    for name, kind, doc, paper in rows():
        print(f"{name:<16} {kind:<7} {doc}")
        print(f"{'':<16} {'':<7} paper: {paper}")
    return 0
