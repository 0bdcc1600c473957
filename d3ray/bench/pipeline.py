"""``d3ray bench pipeline``: a D3 run against a random-order run, same model, data and tokens.

Both runs go through the same driver (``run_pretrain``) on the same Ray instance, one after
the other, so the ratio compares like with like on this machine:

    throughput_ratio       = D3 tokens/s ÷ random-order tokens/s (trainer loop wall time)
    trainer_wait_fraction  = Σ trainer wait for the next ordered chunk ÷ D3 training wall time
                             (also without chunk 0, which cannot overlap with anything)
    influence_sec / solver_sec per chunk, fallback count

The knobs that trade fidelity for cost are the D3 config's ``influence.sample_fraction``,
``influence.param_filter`` and ``influence.sketch.k``; the JSON records the values used. The defaults
are the cheapest that still order well on a 2-core box (k = 256, 1/8 of each batch's sequences, the
last block's MLP and the final layer norm). ``--influence-nice`` (default 19) sets
``schedule.influence_nice``: Ray runs every worker at niceness 15, so 19 gives the trainers the larger
CPU share where the influence actor shares their cores. On a 2-core box the ratio stays noisy either
way (0.73-0.92 at 19, 0.62-0.94 at 15 over runs of 96 steps): the steps that overlap a chunk's
influence are 40-60% slower, because influence is CPU work on the trainers' cores; on GPU clusters it
has its own (fractional) GPU. With ``train.num_workers=1`` the influence actor has the second core to
itself: ratio 0.81-0.86 over three runs of 96-192 steps.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--work-dir", default="runs/bench_pipeline", help="where the two runs are written")
    parser.add_argument("--steps", type=int, default=96, help="optimizer steps of each run")
    parser.add_argument("--L", type=int, default=8, help="chunk length")
    parser.add_argument("--k", type=int, default=256, help="sketch size")
    parser.add_argument("--sample-fraction", type=float, default=0.125, help="influence: fraction of each batch")
    parser.add_argument("--param-filter", default=r"ln_f|h\.1\.mlp", help="influence: regex on parameter names")
    parser.add_argument("--influence-nice", type=int, default=19,
                        help="niceness of the influence actor (schedule.influence_nice; 0 = trainers' priority)")
    parser.add_argument("--estimator", default="hutchinson")
    parser.add_argument("--staleness", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="16 steps, L=4 (a smoke test of the benchmark)")
    parser.add_argument("--d3", action="append", default=[], metavar="KEY=VALUE",
                        help="a dotted override for the D3 run only (repeatable), e.g. schedule.influence_num_gpus=0.25")
    parser.add_argument("overrides", nargs="*", help="extra dotted overrides for both runs (key=value)")


def step_seconds_by_position(metrics: list[dict[str, Any]], L: int) -> list[float | None]:
    """Mean ``time/step_sec`` of the steps at each position 0..L-1 of their chunk.

    Where the influence of the next chunk competes with the trainers for cores, the first positions of
    each chunk (while it runs) are slower than the last; under random order the profile is flat.
    """
    sums, counts = [0.0] * L, [0] * L
    for row in metrics:
        if row.get("time/step_sec") is None or row.get("step") is None:
            continue
        pos = (int(row["step"]) - 1) % L
        sums[pos] += float(row["time/step_sec"])
        counts[pos] += 1
    return [s / n if n else None for s, n in zip(sums, counts, strict=True)]


def _summarise(run_dir: Path, final: dict[str, Any], L: int) -> dict[str, Any]:
    from d3ray.run_files import read_jsonl

    schedule = read_jsonl(run_dir / "schedule_log.jsonl")
    waits = np.array([r.get("trainer_wait_sec", 0.0) for r in schedule])
    train_s = float(final["train_seconds"])
    out = {
        "tokens": int(final["tokens"]),
        "tokens_per_sec": float(final["tokens_per_sec"]),
        "train_seconds": train_s,
        "chunks": len(schedule),
        "trainer_wait_sec": float(waits.sum()),
        "trainer_wait_fraction": float(waits.sum() / train_s),
        "trainer_wait_fraction_after_first_chunk": float(waits[1:].sum() / train_s) if len(waits) > 1 else 0.0,
        "final_loss": float(final["final_loss"]),
        "eval_mean_loss": final.get("eval/mean_loss"),
        "step_sec_by_chunk_position": step_seconds_by_position(read_jsonl(run_dir / "metrics.jsonl"), L),
    }
    # Steady state: without the wait for chunk 0 (data stream start-up, and for D3 the first
    # influence + solve, which nothing can overlap).
    first_wait = float(waits[0]) if len(waits) else 0.0
    out["steady_tokens_per_sec"] = out["tokens"] / max(train_s - first_wait, 1e-9)
    if any("influence_sec" in r for r in schedule):
        inf = [r["influence_sec"] for r in schedule if "influence_sec" in r]
        sol = [r["solver_sec"] for r in schedule if "solver_sec" in r]
        red = [1 - r["cost_after"] / r["cost_stream"] for r in schedule if r.get("cost_stream")]
        out.update(
            influence_sec_per_chunk=float(np.mean(inf)) if inf else None,
            solver_sec_per_chunk=float(np.mean(sol)) if sol else None,
            fallbacks=sum(bool(r.get("fallback")) for r in schedule),
            mean_cost_reduction=float(np.mean(red)) if red else None,
        )
    return out


def run(args: argparse.Namespace) -> int:
    from d3ray.cluster import start_ray, worker_env
    from d3ray.config import RunConfig
    from d3ray.config_loading import load_config
    from d3ray.train.run import run_pretrain

    steps, L = (16, 4) if args.quick else (args.steps, args.L)
    work = Path(args.work_dir).resolve()
    common = [f"--output_dir={work}", f"--train.steps={steps}", f"--schedule.L={L}", "--train.eval_every=0",
              "--eval.max_sequences_per_domain=4", *[f"--{o}" for o in args.overrides]]
    random_cfg = load_config(RunConfig, None, ["--name=random", "--schedule.type=random", *common])
    d3_cfg = load_config(RunConfig, None, [
        "--name=d3", "--schedule.type=d3", f"--schedule.staleness={args.staleness}",
        f"--schedule.influence.estimator={args.estimator}", f"--schedule.influence.sketch.k={args.k}",
        f"--schedule.influence.sample_fraction={args.sample_fraction}",
        f"--schedule.influence.param_filter={args.param_filter}", f"--schedule.influence_nice={args.influence_nice}",
        *common, *[f"--{o}" for o in args.d3]])
    for cfg in (random_cfg, d3_cfg):
        if cfg.run_dir.exists() and any(cfg.run_dir.glob("checkpoint_*")):
            raise SystemExit(f"{cfg.run_dir} holds an earlier run; remove it or pass another --work-dir")
    results = {}
    owns_ray = start_ray(d3_cfg.ray, worker_env(d3_cfg))  # one Ray instance for both runs
    try:
        for label, cfg in (("random", random_cfg), ("d3", d3_cfg)):
            print(f"== {label}: {steps} steps, L={L}", flush=True)
            final = run_pretrain(cfg)
            results[label] = _summarise(cfg.run_dir, final, L)
    finally:
        if owns_ray:
            import ray

            ray.shutdown()
    report = {
        "steps": steps, "L": L, "k": args.k, "sample_fraction": args.sample_fraction,
        "param_filter": args.param_filter, "estimator": args.estimator, "staleness": args.staleness,
        "influence_nice": args.influence_nice, "random": results["random"], "d3": results["d3"],
        "throughput_ratio": results["d3"]["tokens_per_sec"] / results["random"]["tokens_per_sec"],
        "steady_throughput_ratio": results["d3"]["steady_tokens_per_sec"] / results["random"]["steady_tokens_per_sec"],
        "trainer_wait_fraction": results["d3"]["trainer_wait_fraction"],
        "trainer_wait_fraction_after_first_chunk": results["d3"]["trainer_wait_fraction_after_first_chunk"],
        "targets": {"throughput_ratio": ">= 0.80", "trainer_wait_fraction": "< 0.02"},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"\n{'':24}{'random':>12}{'d3':>12}")
    for key in ("tokens_per_sec", "steady_tokens_per_sec", "train_seconds", "trainer_wait_fraction", "final_loss"):
        print(f"{key:<24}{results['random'][key]:>12.4g}{results['d3'][key]:>12.4g}")
    for label in ("random", "d3"):
        profile = " ".join("-" if t is None else f"{t:.3f}" for t in results[label]["step_sec_by_chunk_position"])
        print(f"{label} step seconds by position in chunk: {profile}")
    print(f"throughput_ratio {report['throughput_ratio']:.3f} (steady state {report['steady_throughput_ratio']:.3f}; "
          f"target >= 0.80) | trainer_wait_fraction "
          f"{report['trainer_wait_fraction']:.3f} ({report['trainer_wait_fraction_after_first_chunk']:.3f} after "
          f"chunk 0; target < 0.02) | influence {results['d3'].get('influence_sec_per_chunk')} s/chunk, "
          f"solver {results['d3'].get('solver_sec_per_chunk')} s/chunk, fallbacks {results['d3'].get('fallbacks')}")
    print(f"wrote {args.out}")
    return 0
