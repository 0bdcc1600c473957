"""``d3ray census RUN_DIR --out DIR``: counterfactual chunks of a finished run (d3ray/lab/census/README.md).

    d3ray census runs/tiny --out /tmp/census --checkpoints 4,8 --chunks 2 --random-orders 8
    d3ray census --config jobs/configs/census_pretrain_tiny.yaml --out /tmp/census --checkpoints 10,20,30

With ``--config`` (a run config, dotted overrides after it) the census trains that run first, unless its
run directory holds a finished run (a stopped one resumes), then branches it.

Re-running the same command skips the branches already in ``--out`` and rebuilds the report.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path


def _chunk_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--checkpoints {text!r}: chunk numbers separated by commas, e.g. 4,8") from None


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "census",
        help="train the chunks after a run's checkpoints again in many orders: does order matter, does D3's help?",
        description="From checkpoints of a finished run (d3, random or sequential schedule), train each of the next "
        "chunks of the run's own stream from the same full state (weights, AdamW moments, LR position, RNG) in many "
        "orders: D3 (the run's estimator and solver), the exact look-ahead D3, the reverse and alternating order of "
        "each, the stream order, the run's own order and R seeded random orders; then compare their held-out losses. "
        "Writes <out>/results.md, census.json, one PNG per checkpoint and one JSON per branch (a rerun skips those).",
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", nargs="?", default=None,
                        help="a run directory (config.yaml, checkpoint_*/, schedule_log.jsonl); or --config")
    parser.add_argument("--config", default=None, metavar="FILE",
                        help="a run config instead of RUN_DIR (dotted overrides follow): its run is trained first "
                        "unless finished (it needs train.checkpoint_every_chunks and keep_checkpoints for the checkpoints)")
    parser.add_argument("--out", required=True, help="output directory (branch files and the report)")
    parser.add_argument("--checkpoints", type=_chunk_list, default=None,
                        help="checkpoints by chunk (K = the state before chunk K), e.g. 4,8; default: "
                        "--num-checkpoints evenly spaced past --warmup-chunks")
    parser.add_argument("--num-checkpoints", type=int, default=3, help="automatic checkpoints (default 3)")
    parser.add_argument("--warmup-chunks", type=int, default=None,
                        help="no automatic checkpoint before this chunk (default: a quarter of the run)")
    parser.add_argument("--chunks", type=int, default=1, help="N: chunks branched after each checkpoint (default 1)")
    parser.add_argument("--random-orders", type=int, default=8, help="R: seeded random orders per chunk (default 8)")
    parser.add_argument("--all-orders", action="store_true", help="also all L! orders (L <= 5): D3's regret")
    parser.add_argument("--no-lookahead", action="store_true", help="skip D3 with the exact look-ahead estimator")
    parser.add_argument("--persist", type=int, default=0,
                        help="T: also evaluate after T more chunks (the run's orders) shared by all branches")
    parser.add_argument("--eval", action="append", default=[], metavar="FILE",
                        help="an extra held-out text file (one document a line; repeatable)")
    parser.add_argument("--control", choices=("recency", "planted"), default=None,
                        help="a positive control with a known answer: recency (orders that train one domain's batches "
                        "last must win on its held-out loss; reported with z) or planted (one batch of each branched "
                        "chunk broken: its position must move the held-out loss; give it an --out of its own)")
    parser.add_argument("--control-domain", default=None,
                        help="the recency control's domain (default: per chunk, the one whose count per batch varies most)")
    parser.add_argument("--recency-layout", choices=("stream", "ramp"), default="stream",
                        help="the recency control's batches: stream (the chunk's own) or ramp (its sequences re-dealt "
                        "so --control-domain's count rises linearly over the batches: the layout in which an order "
                        "moves that domain most; every order trains the re-dealt chunk)")
    parser.add_argument("--planted-kind", choices=("shuffled", "repeated"), default="shuffled",
                        help="the planted batch: shuffled (each sequence's tokens permuted, lengths and masks kept; "
                        "default) or repeated (every real token one id)")
    parser.add_argument("--planted-batch", type=int, default=None, metavar="I",
                        help="plant the batch at stream index I (0..L-1) of every chunk (default: per chunk, from --seed)")
    parser.add_argument("--workers", type=int, default=2, help="census actors, each a one-rank engine (default 2)")
    parser.add_argument("--cpus-per-worker", type=float, default=1.0, help="Ray CPUs per census actor (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random orders (default 0)")
    parser.add_argument("--report-only", action="store_true", help="train nothing; rebuild the report from --out")
    parser.set_defaults(func=run, accepts_overrides=True)


def run_dir_of(args: argparse.Namespace) -> Path:
    """The run to branch: RUN_DIR, or the run of ``--config`` (trained first unless it is finished).

    Raises:
        UserError: neither or both of RUN_DIR and ``--config``; overrides without ``--config``; a config whose
            run keeps no checkpoint at a requested chunk (before any training); a run directory holding a
            run trained with another config (``d3ray.run.rerun.check_rerun``).
    """
    from d3ray.errors import UserError

    if (args.run_dir is None) == (args.config is None):
        raise UserError("census: give a RUN_DIR or --config FILE (a run config whose run is trained first), one of them")
    if args.config is None:
        if args.overrides:
            raise UserError(f"census: dotted overrides {args.overrides} apply to --config's run only")
        return Path(args.run_dir)
    from d3ray.config import RunConfig
    from d3ray.config_loading import load_config
    from d3ray.lab.census.census import check_trunk_checkpoints
    from d3ray.run.rerun import check_rerun

    cfg = load_config(RunConfig, args.config, args.overrides)
    # a run directory holding this run finished is branched as it is; one holding another config is refused
    finished = check_rerun(cfg.run_dir, cfg, cfg.train.stop_at_step or cfg.train.steps) is not None
    if not finished and not args.report_only:
        check_trunk_checkpoints(cfg, args.checkpoints)
        print(f"census: training the run {cfg.run_dir} first ({cfg.train.steps} steps, {cfg.schedule.type_name}; "
              "a rerun resumes it)", flush=True)
        from d3ray.run.pretrain import run_pretrain

        run_pretrain(cfg)
    return cfg.run_dir


def run(args: argparse.Namespace) -> int:
    from d3ray.lab.census.census import CensusOptions, check_inputs, load_run, run_census
    from d3ray.lab.census.report import write_report

    options = CensusOptions(
        run_dir=run_dir_of(args), out=Path(args.out), checkpoints=args.checkpoints,
        num_checkpoints=args.num_checkpoints, warmup_chunks=args.warmup_chunks, chunks=args.chunks,
        random_orders=args.random_orders, all_orders=args.all_orders, lookahead=not args.no_lookahead,
        persist=args.persist, eval_files=list(args.eval), control=args.control,
        control_domain=args.control_domain, recency_layout=args.recency_layout, planted_kind=args.planted_kind, planted_batch=args.planted_batch,
        workers=args.workers, cpus_per_worker=args.cpus_per_worker,
        seed=args.seed)
    info = load_run(options.run_dir)
    started = time.perf_counter()
    if args.report_only:
        checkpoints = check_inputs(info, options)
    else:
        done = run_census(options)
        checkpoints = done["checkpoints"]
        print(f"census: trained {done['trained']} branches in {time.perf_counter() - started:.0f} s", flush=True)
    command = " ".join(shlex.quote(a) for a in ["d3ray", *sys.argv[1:]]) if sys.argv[1:2] == ["census"] else \
        " ".join(shlex.quote(a) for a in ["d3ray", "census", str(options.run_dir), "--out", args.out])
    setup = {"run_dir": str(options.run_dir), "schedule": info.cfg.schedule.type_name, "L": info.cfg.schedule.L,
             "checkpoints": checkpoints, "chunks": options.chunks, "random_orders": options.random_orders,
             "all_orders": options.all_orders, "lookahead": options.lookahead, "persist": options.persist,
             "eval_files": options.eval_files, "control": options.control, "control_domain": options.control_domain,
             "recency_layout": options.recency_layout if options.control == "recency" else None,
             "planted_kind": options.planted_kind if options.control == "planted" else None,
             "planted_batch": options.planted_batch, "beta1": info.cfg.train.betas[0]}
    report = write_report(options.out, command, setup)
    failed = sum(len(c["eval"]["failed"]) for c in report["chunks"].values())
    print(f"census report: {options.out / 'results.md'}{f' ({failed} failed branches)' if failed else ''}")
    return 0
