"""``d3ray plot schedule RUN_DIR``: PNGs of a run's schedule."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("plot", help="plots of a run directory")
    sub = parser.add_subparsers(dest="plot", required=True, metavar="WHAT")
    schedule = sub.add_parser("schedule", help="S heatmap, trained order by domain, cost reduction per chunk, a mixer's mixture per chunk")
    schedule.add_argument("run_dir", help="a run directory (runs/<name>)")
    schedule.add_argument("--out", help="output folder (default RUN_DIR/plots)")
    schedule.add_argument("--chunk", type=int, help="chunk id of the S heatmap (default: the first saved)")
    schedule.set_defaults(func=run_schedule)


def run_schedule(args: argparse.Namespace) -> int:
    from d3ray.plot.schedule import plot_schedule

    for path in plot_schedule(args.run_dir, args.out, args.chunk):
        print(path)
    return 0
