"""``d3ray bench pipeline --scheduler NAME``: a run of any scheduler against a random-order run,
same model, data and tokens.

Both runs go through the same driver (``run_pretrain``) on the same Ray instance, one after
the other, so the ratio compares like with like on this machine. ``--repeats`` pairs (default 2)
alternate which of the two runs first: on a 2-core box the second run of a pair is slower by itself
(``--scheduler random``, the A/A check, measured step-time ratios 1.12 and 0.97 for the two orders of
one random-order run against another), so a single pair with the scheduler always second blamed
that on the scheduler. The figures pool every step and token of the repeats:

    throughput_ratio       = scheduler tokens/s ÷ random-order tokens/s (trainer loop wall time)
    trainer_wait_fraction  = Σ trainer wait for the next decided chunk ÷ training wall time
                             (also without chunk 0, which cannot overlap with anything); a checkpoint's
                             wait for the next chunk's decision (it is part of the checkpoint) counts
    loop_seconds           = the training loop's wall time by phase: steps, chunk boundaries (feedback,
                             weights snapshot), checkpoints, evaluations, wait, other
    throughput_ratio_interval95 = the geometric mean of the pairs' ratios and a 95% confidence interval of
                             the expected ratio (Student t on their logarithms; none for one pair): the pairs
                             spread ±0.05-0.15 on the 2-core box, so 4 pairs tell a target 0.05 from the
                             ratio apart only sometimes (docs/results/bench-pipeline-default-d3-2026-12-06.md)
    step_sec_ratio         = mean step time ÷ random order's (what weighting adds to a step), also
                             as a ratio of medians (robust to the box's spikes) and per repeat (spread)
    influence_sec / solver_sec per chunk, fallback count (D3)
    snapshot_bytes per chunk and its dtype (schedulers that read weights; ``schedule.placement.snapshot_dtype``)
    cpu_share              = per process role (trainers, influence actor, coordinator, driver, Ray), the
                             share of the box's cores it used over each whole run (setup included):
                             what the scheduler's actors take and what it costs the trainers beyond
                             that (``d3ray/lab/bench/cpu_share.py``; Linux only)

The scheduler runs with the run config's defaults for it (D3: ``d3ray.config.FIRST_RUN_SCHEDULE``, the
influence defaults: drift with ``residual: none`` and the AdamW step, the exact potential of 1/8 of each
batch's sequences over all parameters, nothing sketched, scored by the trainers themselves
(``placement: {type: in_trainer}``), chunk 0 in stream order: ``first_chunk_stream_order`` counts such rows);
``--set KEY=VALUE`` changes them for the scheduler's run only (``--set 'schedule.placement={type: actors, nice:
19}'``: the influence actor, at niceness 19 where it shares the trainers' cores; Ray runs every worker at 15),
and the JSON records the resolved schedule config. On a 2-core box influence is CPU work on the trainers'
cores whoever does it; on GPU clusters the actors have their own (fractional) GPU. ``--own-cores`` is the CPU
stand-in for that: trainer i alone on core i, the rest of the run on the other cores (``pinning.py``). Measured figures:
README.md ("Benchmarks").
"""

from __future__ import annotations

import argparse
import json
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np

from d3ray.lab.bench.cpu_share import pool_cpu_shares

logger = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--work-dir", default="runs/bench_pipeline", help="where the two runs are written")
    parser.add_argument("--config", default=None,
                        help="a run config YAML both runs start from (e.g. jobs/configs/redpajama_sample.yaml); "
                             "its steps and L unless --steps / --L are given")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps of each run (default 96, or --config's)")
    parser.add_argument("--L", type=int, default=None, help="chunk length (default 8, or --config's)")
    parser.add_argument("--scheduler", default="d3", help="the scheduler to measure against random order (default d3)")
    parser.add_argument("--quick", action="store_true",
                        help="16 steps, L=4, one repeat (a smoke test of the benchmark)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="pairs of runs (default 2; 1 with --quick): random order and the scheduler alternate "
                             "which runs first, and the figures pool the steps of every run")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="sets",
                        help="a dotted override for the scheduler's run only (repeatable), "
                             "e.g. 'schedule.placement={type: actors, num_gpus: 0.25}'")
    parser.add_argument("--own-cores", action="store_true",
                        help="trainer i on core i alone, every other process of the run (driver, coordinator, actors, "
                             "Ray) on the cores after the trainers', in both runs: the CPU stand-in for trainers with "
                             "devices of their own (d3ray/lab/bench/pinning.py; Linux)")
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


def _model_numel(run_dir: Path) -> int | None:
    """Parameters of the run's model (from its last checkpoint's model.json), or None without one."""
    described = sorted(run_dir.glob("checkpoint_*/model.json"))
    if not described:
        return None
    from d3ray.model import ModelConfig, build_model

    model = build_model(json.loads(described[-1].read_text())["config"], ModelConfig())
    return sum(p.numel() for p in model.parameters())


def _summarise(run_dir: Path, final: dict[str, Any], L: int) -> dict[str, Any]:
    from d3ray.run_files import read_jsonl

    schedule = read_jsonl(run_dir / "schedule_log.jsonl")
    waits = np.array([r.get("trainer_wait_sec", 0.0) for r in schedule])
    train_s = float(final["train_seconds"])
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    step_secs = [float(r["time/step_sec"]) for r in metrics if r.get("time/step_sec") is not None]
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
        "step_sec_by_chunk_position": step_seconds_by_position(metrics, L),
        "step_secs": step_secs,
        "mean_step_sec": float(np.mean(step_secs)),
        "median_step_sec": float(np.median(step_secs)),
        "fallbacks": sum(bool(r.get("fallback")) for r in schedule),
        "first_chunk_stream_order": sum(r.get("first_chunk") == "stream_order" for r in schedule),
    }
    # Steady state: without the wait for chunk 0 (data stream start-up, and for D3 the first
    # influence + solve, which nothing can overlap).
    first_wait = float(waits[0]) if len(waits) else 0.0
    out["first_chunk_wait_sec"] = first_wait
    out["steady_tokens_per_sec"] = out["tokens"] / max(train_s - first_wait, 1e-9)
    out["loop_seconds"] = loop_breakdown(metrics, float(waits.sum()), train_s)
    scoring = [r["time/in_trainer_influence_sec"] for r in metrics if r.get("time/in_trainer_influence_sec") is not None]
    publish = [r["time/snapshot_sec"] for r in metrics if r.get("time/snapshot_sec") is not None]
    # the checkpoint's parts (d3ray/train/checkpointer.py): the coordinator's state, the save, Ray Train's report
    out["checkpoint_parts_sec"] = {part: float(sum(r.get(f"time/checkpoint_{part}_sec") or 0.0 for r in metrics))
                                   for part in ("state", "arrival", "save", "report")}
    if publish:  # the trainers' time publishing weight snapshots at chunk boundaries (not wait, not steps)
        out["snapshot_sec"] = float(sum(publish))
        out["snapshot_fraction"] = float(sum(publish) / train_s)
    if scoring:  # placement in_trainer: trainer time spent sketching (not wait)
        out["in_trainer_influence_sec"] = float(sum(scoring))
        out["in_trainer_influence_fraction"] = float(sum(scoring) / train_s)
        for part in ("fetch", "score"):  # the pass split: the batches' fetch, and the scoring itself
            out[f"in_trainer_{part}_sec"] = float(sum(r.get(f"time/in_trainer_{part}_sec") or 0.0 for r in metrics))
    if any("influence_bytes" in r for r in schedule):
        out["influence_bytes_per_chunk"] = float(np.mean([r["influence_bytes"] for r in schedule if "influence_bytes" in r]))
        numel = _model_numel(run_dir)
        if numel:
            out["full_weight_snapshot_bytes_fp32"] = 4 * numel
            out["influence_bytes_vs_fp32_snapshot"] = out["influence_bytes_per_chunk"] / (4 * numel)
    if any("influence_sec" in r for r in schedule):
        inf = [r["influence_sec"] for r in schedule if "influence_sec" in r]
        sol = [r["solver_sec"] for r in schedule if "solver_sec" in r]
        vs_random = [r["predicted_loss_change_vs_random_nats"] for r in schedule
                     if r.get("predicted_loss_change_vs_random_nats") is not None]
        out.update(
            influence_sec_per_chunk=float(np.mean(inf)) if inf else None,
            solver_sec_per_chunk=float(np.mean(sol)) if sol else None,
            decided_by=sorted({r["decided_by"] for r in schedule if r.get("decided_by")}),
            searched_chunks=sum(bool(r.get("search")) for r in schedule),
            predicted_loss_change_vs_random_nats_per_chunk=float(np.mean(vs_random)) if vs_random else None,
        )
    out.update(snapshot_summary(schedule))
    return out


#: The training loop's phases as the trainers log them (rank 0's clock: d3ray/train/step_logger.py, the
#: checkpoint's in d3ray/train/checkpointer.py with the coordinator's state collected, the eval's in evaluator.py).
LOOP_PHASES = {"steps": "time/step_sec", "chunk_boundary": "time/chunk_boundary_sec",
               "checkpoint": "time/checkpoint_sec", "eval": "time/eval_sec"}


def loop_breakdown(metrics: list[dict[str, Any]], wait_s: float, train_s: float) -> dict[str, float]:
    """Where the training loop's wall time went: the summed seconds of each phase (steps, the chunk
    boundary's feedback and weights snapshot, checkpoints with the coordinator's state, evaluations), the wait for decided chunks
    (the schedule log's, a checkpoint's wait for the next decision included), and ``other`` (the rest:
    logging, Ray calls between steps)."""
    out = {name: float(sum(r[key] for r in metrics if r.get(key) is not None)) for name, key in LOOP_PHASES.items()}
    out["wait"] = wait_s
    out["other"] = train_s - sum(out.values())
    return out


def loop_ratios(mine: dict[str, float], base: dict[str, float]) -> dict[str, float | None]:
    """Each training-loop phase's summed seconds, the scheduler's ÷ random order's (None where random
    order spent none): the checkpoint's is the scheduler's checkpoint cost in proportion (issue 50.3)."""
    return {k: (mine[k] / base[k] if base.get(k) else None) for k in mine if k in base}


def ratio_interval(ratios: list[float], level: float = 0.95) -> tuple[float, float, float] | None:
    """(geometric mean, low, high) of per-pair ratios: the census's Student t interval
    (``d3ray.lab.census.stats.t_interval``) on their logarithms at ``level``, mapped back (a ratio's spread is
    multiplicative). None for fewer than two pairs.

    Raises:
        ValueError: a ratio that is not finite and > 0.
    """
    from d3ray.lab.census.stats import t_interval

    logs = np.log(np.asarray(ratios, dtype=np.float64))
    if not np.all(np.isfinite(logs)):
        raise ValueError(f"ratio_interval: every ratio must be finite and > 0, got {ratios}")
    if logs.size < 2:
        return None
    mean, low, high = t_interval(logs, confidence=level)
    return math.exp(mean), math.exp(low), math.exp(high)


def pool_summaries(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One scheduler's figures over its repeated runs: rates and fractions from the summed tokens,
    seconds and waits, step times over all steps of all runs, the per-position profile averaged;
    other numbers averaged, other values from the first run; ``runs`` keeps every run's own."""
    if len(runs) == 1:
        return {**runs[0], "runs": runs}
    out: dict[str, Any] = {}
    for key in runs[0]:
        values = [r[key] for r in runs if r.get(key) is not None]
        if values and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            out[key] = float(np.mean(values))
        else:
            out[key] = runs[0][key]
    tokens = sum(r["tokens"] for r in runs)
    train_s = sum(r["train_seconds"] for r in runs)
    waits = sum(r["trainer_wait_sec"] for r in runs)
    first = sum(r["first_chunk_wait_sec"] for r in runs)
    steps = [t for r in runs for t in r["step_secs"]]
    positions = zip(*(r["step_sec_by_chunk_position"] for r in runs), strict=True)
    out.update(
        tokens=tokens, train_seconds=train_s, tokens_per_sec=tokens / train_s,
        steady_tokens_per_sec=tokens / max(train_s - first, 1e-9),
        chunks=sum(r["chunks"] for r in runs), fallbacks=sum(r["fallbacks"] for r in runs),
        first_chunk_stream_order=sum(r.get("first_chunk_stream_order", 0) for r in runs),
        trainer_wait_sec=waits, first_chunk_wait_sec=first, trainer_wait_fraction=waits / train_s,
        trainer_wait_fraction_after_first_chunk=(waits - first) / train_s,
        step_secs=steps, mean_step_sec=float(np.mean(steps)), median_step_sec=float(np.median(steps)),
        step_sec_by_chunk_position=[float(np.mean(v)) if (v := [t for t in p if t is not None]) else None
                                    for p in positions],
        cpu_share=pool_cpu_shares([r.get("cpu_share", {}) for r in runs]),
        loop_seconds={k: float(sum(r["loop_seconds"][k] for r in runs)) for k in runs[0].get("loop_seconds", {})},
        checkpoint_parts_sec={k: float(sum(r["checkpoint_parts_sec"][k] for r in runs))
                              for k in runs[0].get("checkpoint_parts_sec", {})},
        searched_chunks=sum(r.get("searched_chunks", 0) for r in runs),
        runs=runs,
    )
    return out


def snapshot_summary(schedule: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean bytes of the weights snapshot a chunk was decided at, and the dtype(s) it travelled in
    (schedule-log ``snapshot_bytes``, ``snapshot_dtype``); empty for a scheduler that reads no weights."""
    rows = [r for r in schedule if r.get("snapshot_bytes") is not None]
    if not rows:
        return {}
    return {"snapshot_bytes_per_chunk": float(np.mean([r["snapshot_bytes"] for r in rows])),
            "snapshot_dtype": ",".join(sorted({str(r.get("snapshot_dtype")) for r in rows}))}


def run_labels(scheduler: str) -> tuple[str, str]:
    """(random-order run, scheduler run) labels: also their run names (``--scheduler random`` is the
    A/A check of the benchmark itself: random order against a second random-order run)."""
    return "random", scheduler if scheduler != "random" else "random_b"


def bench_configs(args: argparse.Namespace, repeat: int = 0) -> tuple[Any, Any]:
    """(random-order run, scheduler run): the same data, model, trainers and steps; ``--config`` is the
    base of both (its schedule section only when it already is the measured scheduler), ``--steps`` /
    ``--L`` / ``--quick`` and the positional overrides apply to both, ``--set`` to the scheduler's run.
    Repeat ``i > 0`` names its runs ``<label>_<i+1>``."""
    from d3ray.config import RunConfig
    from d3ray.config_loading import load_config

    base = load_config(RunConfig, args.config, []) if args.config else None
    if args.quick:
        steps, L = 16, 4
    else:
        steps = args.steps or (base.train.steps if base else 96)
        L = args.L or (base.schedule.L if base else 8)
    name = args.scheduler
    suffix = f"_{repeat + 1}" if repeat else ""
    random_name, sched_name = (label + suffix for label in run_labels(name))
    work = Path(args.work_dir).resolve()
    common = [f"--output_dir={work}", f"--train.steps={steps}", f"--schedule.L={L}", "--train.eval_every=0",
              *([] if base else ["--eval.max_sequences_per_domain=4"]), *[f"--{o}" for o in args.overrides]]
    keep = base is not None and base.schedule.type_name == name
    random_cfg = load_config(RunConfig, args.config, [f"--name={random_name}", "--schedule.type=random", *common])
    sched_cfg = load_config(RunConfig, args.config, [f"--name={sched_name}",
                                                     *([] if keep else [f"--schedule.type={name}"]),
                                                     *common, *[f"--{o}" for o in args.sets]])
    return random_cfg, sched_cfg


def repeat_order(repeats: int) -> list[tuple[int, bool]]:
    """(repeat, scheduler first?) in running order: the two runs alternate which goes first, so that
    whatever favours the first or second run of a pair (a warm page cache, the previous run's
    processes winding down) cancels over an even number of repeats."""
    return [(i, i % 2 == 1) for i in range(repeats)]


def run(args: argparse.Namespace) -> int:
    from contextlib import nullcontext

    from d3ray.config_loading import to_dict
    from d3ray.lab.bench.cpu_share import CpuShare
    from d3ray.lab.bench.pinning import CorePinner
    from d3ray.run.cluster import start_ray, worker_env

    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 2)
    if repeats < 1:
        raise SystemExit(f"--repeats {repeats} must be >= 1")
    pairs = [bench_configs(args, i) for i in range(repeats)]
    random_cfg, sched_cfg = pairs[0]
    steps, L, name = sched_cfg.train.steps, sched_cfg.schedule.L, args.scheduler
    base_label, label = run_labels(name)
    for cfg in (c for pair in pairs for c in pair):
        if cfg.run_dir.exists() and any(cfg.run_dir.glob("checkpoint_*")):
            raise SystemExit(f"{cfg.run_dir} holds an earlier run; remove it or pass another --work-dir")
    per_run: dict[str, list[dict[str, Any]]] = {base_label: [], label: []}
    owns_ray = start_ray(sched_cfg.ray, worker_env(sched_cfg))  # one Ray instance for every run
    try:
        from d3ray.run.pretrain import run_pretrain

        for i, sched_first in repeat_order(repeats):
            runs = [(base_label, pairs[i][0]), (label, pairs[i][1])]
            for lab, cfg in reversed(runs) if sched_first else runs:
                print(f"== {cfg.name} (repeat {i + 1}/{repeats}): {steps} steps, L={L}", flush=True)
                with CpuShare() as share, (CorePinner(cfg.train.num_workers) if args.own_cores else nullcontext()):
                    final = run_pretrain(cfg)
                per_run[lab].append({**_summarise(cfg.run_dir, final, L), "cpu_share": share.summary()})
    finally:
        if owns_ray:
            import ray

            ray.shutdown()
    results = {lab: pool_summaries(runs) for lab, runs in per_run.items()}
    mine, base = results[label], results[base_label]
    ratios = [m["tokens_per_sec"] / b["tokens_per_sec"] for m, b in zip(per_run[label], per_run[base_label], strict=True)]
    interval = ratio_interval(ratios)
    report = {
        "steps": steps, "L": L, "scheduler": name, "repeats": repeats, "own_cores": args.own_cores,
        "schedule": to_dict(sched_cfg.schedule),
        base_label: base, label: mine,
        "throughput_ratio": mine["tokens_per_sec"] / base["tokens_per_sec"],
        "steady_throughput_ratio": mine["steady_tokens_per_sec"] / base["steady_tokens_per_sec"],
        "step_sec_ratio": mine["mean_step_sec"] / base["mean_step_sec"],
        "median_step_sec_ratio": mine["median_step_sec"] / base["median_step_sec"],
        "step_sec_ratio_by_repeat": [m["mean_step_sec"] / b["mean_step_sec"]
                                     for m, b in zip(per_run[label], per_run[base_label], strict=True)],
        "throughput_ratio_by_repeat": ratios,
        "loop_seconds_ratio": loop_ratios(mine.get("loop_seconds") or {}, base.get("loop_seconds") or {}),
        "throughput_ratio_interval95": None if interval is None else dict(
            zip(("geometric_mean", "low", "high"), interval, strict=True)),
        "trainer_wait_fraction": mine["trainer_wait_fraction"],
        "trainer_wait_fraction_after_first_chunk": mine["trainer_wait_fraction_after_first_chunk"],
        "targets": {"throughput_ratio": ">= 0.92 (d3, the defaults, 2-core box; >= 0.97 where the trainers have "
                                        "cores or devices of their own), >= 0.80 (d3, jobs/configs/redpajama_sample.yaml)",
                    "trainer_wait_fraction": "< 0.02",
                    "loop_seconds_ratio.checkpoint": "<= 1.10 (the scheduler's checkpoint cost)",
                    "step_sec_ratio": "< 1.03 (weighting)"},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"\n{'':24}{base_label:>14}{label:>14}   ({repeats} run(s) each, pooled)")
    for key in ("tokens_per_sec", "steady_tokens_per_sec", "mean_step_sec", "median_step_sec", "train_seconds",
                "trainer_wait_fraction", "final_loss"):
        print(f"{key:<24}{base[key]:>14.4g}{mine[key]:>14.4g}")
    for lab in (base_label, label):
        parts = results[lab].get("loop_seconds") or {}
        if parts:
            total = sum(parts.values())
            print(f"{lab} training loop, {total:.2f} s: " + ", ".join(f"{k} {v / total:.1%}" for k, v in parts.items()))
    for lab in (base_label, label):
        share = results[lab].get("cpu_share") or {}
        if share:
            roles = ", ".join(f"{role} {v:.1%}" for role, v in share["by_role"].items() if v >= 0.005)
            print(f"{lab} CPU, share of the box's {share['cpus']} cores over the whole runs: busy {share['busy']:.1%}: "
                  f"{roles}")
    for lab in (base_label, label):
        profile = " ".join("-" if t is None else f"{t:.3f}" for t in results[lab]["step_sec_by_chunk_position"])
        print(f"{lab} step seconds by position in chunk: {profile}")
    by_repeat = " ".join(f"{r:.3f}" for r in report["step_sec_ratio_by_repeat"])
    spread = (f"; pairs {interval[0]:.3f}, 95% interval {interval[1]:.3f}-{interval[2]:.3f}"
              if interval is not None else "")
    print(f"throughput_ratio {report['throughput_ratio']:.3f} (steady state {report['steady_throughput_ratio']:.3f}"
          f"{spread}) | "
          f"step_sec_ratio {report['step_sec_ratio']:.3f} (median {report['median_step_sec_ratio']:.3f}; "
          f"by repeat {by_repeat}) | trainer_wait_fraction "
          f"{report['trainer_wait_fraction']:.3f} ({report['trainer_wait_fraction_after_first_chunk']:.3f} after "
          f"chunk 0; target < 0.02) | fallbacks {mine.get('fallbacks')} | first chunk wait "
          f"{mine['first_chunk_wait_sec']:.2f} s (chunk 0 in stream order in {mine.get('first_chunk_stream_order', 0)} runs)")
    if "in_trainer_influence_fraction" in mine:
        print(f"in-trainer sketching {mine['in_trainer_influence_fraction']:.1%} of training time (trainer time, "
              f"not wait): fetch {mine.get('in_trainer_fetch_sec', 0.0):.2f} s, score "
              f"{mine.get('in_trainer_score_sec', 0.0):.2f} s (per run)")
    if "influence_bytes_vs_fp32_snapshot" in mine:
        print(f"influence bytes per chunk (to the scheduler) {mine['influence_bytes_per_chunk']:.0f} = "
              f"{mine['influence_bytes_vs_fp32_snapshot']:.3%} of a float32 full-weight snapshot")
    if report["loop_seconds_ratio"]:
        print("training loop by phase, " + label + " ÷ " + base_label + ": "
              + ", ".join(f"{k} {v:.3f}" for k, v in report["loop_seconds_ratio"].items() if v is not None))
    parts = [(lab, results[lab].get("checkpoint_parts_sec")) for lab in (base_label, label)]
    if all(p for _, p in parts):
        print("checkpoint parts, s over all runs (the coordinator's state, the wait for every rank, the save, Ray Train's report): "
              + "; ".join(f"{lab} " + ", ".join(f"{k} {v:.3f}" for k, v in p.items()) for lab, p in parts))
    if "influence_sec_per_chunk" in mine:
        print(f"influence {mine['influence_sec_per_chunk']} s/chunk, solver {mine['solver_sec_per_chunk']} s/chunk; "
              f"decided by {', '.join(mine['decided_by']) or '-'} (a search in {mine['searched_chunks']} chunks); "
              f"predicted loss change vs the mean random order {mine['predicted_loss_change_vs_random_nats_per_chunk']} "
              f"nats per chunk")
    if "snapshot_bytes_per_chunk" in mine:
        published = (f", publishing it {mine['snapshot_fraction']:.1%} of training time (trainer time, not wait)"
                     if "snapshot_fraction" in mine else "")
        print(f"weights snapshot {mine['snapshot_bytes_per_chunk'] / 2**20:.3f} MiB per chunk ({mine['snapshot_dtype']})"
              f"{published}")
    print(f"wrote {args.out}")
    return 0
