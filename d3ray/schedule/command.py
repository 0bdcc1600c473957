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
    if name in ("d3", "d3_paper"):
        print("presets:")
        for preset, what, keys in d3_presets():
            print(f"  {preset}: {what}")
            print("\n".join(f"      {key}" for key in keys))
        print()
    print("schedule:   # --schedule.KEY=VALUE, or under schedule: in a --config file")
    print("\n".join("  " + line for line in describe_class(cls)))
    if name in ("d3", "d3_paper"):
        print("\n".join(placement_lines()))
    return 0


def placement_lines() -> list[str]:
    """D3's placements (``schedule.placement: {type: NAME, ...}``), each with its first doc line and its keys."""
    from d3ray.config_docs import describe_class, first_sentence
    from d3ray.schedule.order.d3.placements import PlacementConfig

    lines = ["", "placements:   # schedule.placement: {type: NAME, ...} (d3ray/schedule/order/d3/placements/)"]
    for name in PlacementConfig.known():
        cls = PlacementConfig.lookup(name)
        lines.append(f"  {name}: {first_sentence(cls.__doc__ or '')}")
        lines.extend("      " + line for line in describe_class(cls) if not line.startswith("type:"))
    return lines


def d3_presets() -> list[tuple[str, str, list[str]]]:
    """(name, what it is, the keys it sets) of D3's two configurations, for ``d3ray schedulers d3``."""
    from d3ray.config import FIRST_RUN_SCHEDULE
    from d3ray.schedule.order.d3 import PAPER_KEYS

    default = FIRST_RUN_SCHEDULE
    return [
        ("d3", "the default (the no-argument run): an order by the AdamW drift potential, each chunk sorted by "
               "f_i computed by the trainers between chunks; no S, no search, no actor",
         [f"schedule.influence.estimator={default.influence.estimator.describe()}",
          f"schedule.influence.preconditioner={default.influence.preconditioner}",
          f"schedule.influence.sample_fraction={default.influence.sample_fraction}",
          f"schedule.placement.type={default.placement.type_name} (the trainers score the next chunk)",
          f"schedule.first_chunk={default.first_chunk}", f"schedule.L={default.L}",
          "the order: sorted by potential, no search (schedule.solver unused)"]),
        ("d3_paper", "the paper's pipeline (schedule.type=d3_paper); --schedule.solver.type=ils is stronger than "
                     "the paper's RSR (the log then names the departure)",
         [f"{key}={value}" for key, (_, value) in PAPER_KEYS.items()]),
    ]

