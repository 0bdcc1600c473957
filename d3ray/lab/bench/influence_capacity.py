"""``d3ray bench influence-capacity``: what the default influence costs, from this CPU to 70B parameters.

1. Measures the constants on this machine (``capacity_measure``): for the tiny and small GPT-2 and the
   124M preset (at the bench vocabulary), the step time and the default estimator's figures (``drift``,
   ``residual: none``: the gradient of the scored sequence and one full-dimension dot product per batch,
   w once per chunk), bfloat16 snapshot bytes/s through Ray, memory copy bandwidth, a gloo all-reduce.
2. Feeds them to the capacity model (``capacity_model``, pure): per architecture and trainer GPU count,
   the cost of one chunk phase by phase (publish, transfer, host→device, w, forward+backward and
   potential per batch) and the influence actor's share of the chunk's training time; snapshot mode (memory
   per actor, the fewest actors that keep the trainer wait under 2%) and in-trainer sharded mode. Once on
   this machine's own constants (the measured models on 2 ranks), then for GPT-2 124M, Llama 1B, 7B, 70B on
   a GPU (``capacity_devices``): projected from spec sheets and stated assumptions, or from
   ``gpu_constants.json`` that ``bench/gpu_check.sh`` writes on a GPU.
3. Prints the tables (``~`` marks a figure that rests on a projected constant) and writes JSON (``--out``).
"""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from d3ray.lab.bench.capacity_arch import ARCHITECTURES, Architecture, param_count
from d3ray.lab.bench.capacity_in_trainer import (
    in_trainer_plan,
)
from d3ray.lab.bench.capacity_model import (
    ESTIMATORS,
    POTENTIAL_BYTES,
    POTENTIALS,
    DeviceConstants,
    InfluenceLoad,
    chunk_coordinate_bytes,
)
from d3ray.lab.bench.capacity_snapshot import (
    chunk_cost,
    snapshot_plan,
)
from d3ray.lab.bench.influence_setup import DEFAULT_DATA

logger = logging.getLogger(__name__)

MEASURED_LOAD = InfluenceLoad(potential_method="gradient")
"""What ``capacity_measure`` times (its w and potential lines are compared with this load's bytes)."""

__all__ = ["DEFAULT_TRAIN_GPUS", "add_arguments", "print_chunk_costs", "print_plans", "run"]

#: Trainer GPUs per architecture when ``--train-gpus`` is not given: one node, one node, 8 and 64 nodes.
DEFAULT_TRAIN_GPUS = {"gpt2-124m": 8, "llama-1b": 8, "llama-7b": 64, "llama-70b": 512}
GPU_CONSTANTS = Path("runs/gpu_check/gpu_constants.json")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``d3ray bench influence-capacity``."""
    parser.add_argument("--out", type=Path, help="write constants and tables as JSON here")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="SlimPajama-layout sample (train/, validation/)")
    parser.add_argument("--workdir", type=Path, default=Path("runs/bench_influence_capacity"), help="tokenizer cache")
    parser.add_argument("--models", default="tiny,small,gpt2-124m",
                        help="measured models: tiny, small or a d3ray preset name (at the bench vocabulary)")
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per measured batch")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=1024, help="BPE vocabulary trained on the sample")
    parser.add_argument("--repeats", type=int, default=2, help="timed repeats of every measurement (least kept)")
    parser.add_argument("--batches-per-call", type=int, default=8, help="batches per timed influence call (a chunk)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads in this process (0 = default)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda: where the model constants are measured")
    parser.add_argument("--snapshot-presets", default="gpt2-124m",
                        help="presets whose bfloat16 state dict + m + v go through ray.put/get (the largest sets the rate)")
    parser.add_argument("--skip-allreduce", action="store_true", help="no gloo all-reduce (two spawned processes)")
    parser.add_argument("--gpu", default="h100,h200", help="GPUs of the projection, comma list of h100, h200, a100")
    parser.add_argument("--measured", type=Path, help="reuse the measured constants of an earlier --out JSON")
    parser.add_argument("--gpu-constants", type=Path, default=GPU_CONSTANTS,
                        help="measured GPU constants (bench/gpu_check.sh); used when the file exists")
    parser.add_argument("--write-gpu-constants", type=Path,
                        help="on a GPU (--device cuda): write the measured GPU constants here")
    parser.add_argument("--influence-mfu", type=float,
                        help="what-if for the projection: the influence forward+backward's share of the bf16 peak "
                             "(default: the float32 worker on the fp32 peak)")
    parser.add_argument("--train-gpus", type=int, help=f"trainer GPUs for every architecture (default {DEFAULT_TRAIN_GPUS})")
    parser.add_argument("--cpu-ranks", type=int, default=2, help="trainer ranks of the model on this machine")
    parser.add_argument("--estimator", default="drift", choices=ESTIMATORS,
                        help="priced estimator: drift (the default, residual none), drift_sketch, first_order")
    parser.add_argument("--L", type=int, default=8, help="batches per chunk")
    parser.add_argument("--sample-fraction", type=float, default=0.125)
    parser.add_argument("--k", type=int, default=16384, help="sketch size (sketched estimators only)")
    parser.add_argument("--snapshot-dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--potential", default="step", choices=POTENTIALS,
                        help="how the actors get f_i with drift (DriftConfig.potential; in-trainer: always gradient)")


def run(args: argparse.Namespace) -> int:
    """Measure (or reload ``--measured``), model, print, write JSON."""
    from d3ray.lab.bench import capacity_devices as devices
    from d3ray.lab.bench import capacity_measure as measure

    load = InfluenceLoad(estimator=args.estimator, L=args.L, sample_fraction=args.sample_fraction, k=args.k,
                         snapshot_bytes_per_value=2 if args.snapshot_dtype == "bfloat16" else 4,
                         potential_method=args.potential)
    if args.measured:
        raw = json.loads(args.measured.read_text())["measured"]
        measured, snapshots = measure.measured_from_dict(raw), {}
        print(f"measured constants from {args.measured}")
    else:
        measured, snapshots = _measure(args, load)
    report: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items() if k != "func"},
                              "load": asdict(load), "measured": _measured_dict(measured, snapshots)}
    print_measured(measured, snapshots, load.L)

    cpu_rows = [_plans(devices.timing_architecture(t), load, devices.cpu_constants(measured, t), args.cpu_ranks)
                for t in measured.models]
    shapes = sorted({f"B={t.batch_size}, T={t.seq_len}" for t in measured.models})
    print(f"\n== the model on this machine's constants ({args.cpu_ranks} trainer ranks, {'; '.join(shapes)}, "
          f"L={load.L}, {load.estimator}; measured constants, modelled placement)")
    print_chunk_costs(cpu_rows, projected=False)
    print_plans(cpu_rows, projected=False)
    report["this_machine"] = cpu_rows

    report["gpus"] = {}
    for gpu in _gpu_devices(args, measured):
        if args.write_gpu_constants:
            devices.write_device(gpu, args.write_gpu_constants)
            print(f"wrote {args.write_gpu_constants}")
        rows = [_plans(arch, load, gpu, args.train_gpus or DEFAULT_TRAIN_GPUS[name])
                for name, arch in ARCHITECTURES.items()]
        projected = bool(gpu.projected_fields)
        sketch = f", k={load.k}" if load.sketches else " (exact potential, nothing sketched)"
        print(f"\n== {gpu.name}: L={load.L}, s={load.sample_fraction}, {load.estimator} + adam{sketch}, "
              f"{args.snapshot_dtype} snapshots, wait target {load.wait_target:.0%}"
              + ("; ~ = rests on a projected constant" if projected else ""))
        for field_name, source in gpu.provenance.items():
            print(f"   {field_name:<26} {getattr(gpu, field_name):<12.4g} {source}")
        print_chunk_costs(rows, projected=projected)
        print_plans(rows, projected=projected)
        report["gpus"][gpu.name] = {"device": devices.jsonable(asdict(gpu)), "projected_fields": gpu.projected_fields,
                                    "rows": rows}
    print("architectures (params, layers, hidden, vocab, T, B): " + "; ".join(
        f"{a.name} {_count(param_count(a))} {a.layers}x{a.hidden} V{a.vocab} T{a.seq_len} B{a.batch_sequences}"
        for a in ARCHITECTURES.values()))
    report["architectures"] = {n: asdict(a) | {"params": param_count(a)} for n, a in ARCHITECTURES.items()}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(devices.jsonable(report), indent=1))
        print(f"wrote {args.out}")
    return 0


def _measure(args: argparse.Namespace, load: InfluenceLoad) -> tuple[Any, dict[str, Any]]:
    """All measurements of this machine (``capacity_measure``), in one process (the all-reduce spawns two)."""
    import torch

    from d3ray.lab.bench import capacity_measure as measure
    from d3ray.lab.bench.influence_setup import load_corpus

    if args.threads:
        torch.set_num_threads(args.threads)
    corpus = load_corpus(args.data, args.workdir, args.vocab, args.seq_len, per_domain=64)
    timings = []
    for model in [m for m in args.models.split(",") if m]:
        print(f"== measuring {model} on {args.device}", flush=True)
        timings.append(measure.time_model(model, corpus, args.batch_size, args.seq_len, args.device,
                                          args.repeats, args.batches_per_call))
    snapshots = {}
    for preset in [p for p in args.snapshot_presets.split(",") if p]:
        print(f"== snapshot of {preset} through Ray", flush=True)
        parts = measure.snapshot_parts(_preset_config(preset, corpus, args.seq_len))
        snapshots[preset] = measure.time_snapshot(parts, args.repeats)
        del parts
    allreduce, notes = None, []
    if args.skip_allreduce:
        notes.append("all-reduce skipped (--skip-allreduce): the in-trainer rows of this machine assume free collectives")
    else:
        print("== all-reduce, 2 gloo processes", flush=True)
        small = load.statistics * load.k if load.sketches else 2  # one f_i (float64) per batch, or a projection
        allreduce = measure.time_allreduce([small, 1 << 22], repeats=10 * args.repeats)
    measured = measure.MeasuredConstants(
        device=_device_name(args.device), threads=torch.get_num_threads(), memory_bytes=_memory_bytes(args.device),
        copy_bytes_per_sec=measure.copy_bytes_per_sec(args.device), models=timings,
        snapshot=max(snapshots.values(), key=lambda s: s.bytes), allreduce=allreduce, notes=notes,
    )
    return measured, snapshots


def _plans(arch: Architecture, load: InfluenceLoad, dev: DeviceConstants, ranks: int) -> dict[str, Any]:
    """Snapshot mode, and in-trainer mode with a ZeRO-3 gather per batch and per chunk."""
    snap = snapshot_plan(arch, load, dev, ranks)
    out = {
        "model": arch.name, "params": param_count(arch), "ranks": ranks,
        "chunk_cost": asdict(chunk_cost(arch, load, dev, ranks)),
        "snapshot": asdict(snap) | {"memory_floor_total": snap.memory_floor.total,
                                    "memory_as_coded_total": snap.memory_as_coded.total},
    }
    for key, per in (("in_trainer", 1), ("in_trainer_gather_per_chunk", load.L)):
        plan = in_trainer_plan(arch, replace(load, batches_per_gather=per), dev, ranks)
        out[key] = asdict(plan) | {"extra_memory_total": plan.extra_memory.total}
    return out


def _gpu_devices(args: argparse.Namespace, measured: Any) -> list[DeviceConstants]:
    """On a GPU: its measured constants. Else ``--gpu-constants`` when the file exists, else projections."""
    from d3ray.lab.bench import capacity_devices as devices

    kinds = [g for g in args.gpu.split(",") if g]
    if args.device.startswith("cuda"):
        return [devices.measured_gpu(_gpu_kind(measured.device, kinds[0]), measured)]
    if args.write_gpu_constants:
        raise SystemExit("--write-gpu-constants needs --device cuda (it writes what a GPU measures)")
    if args.gpu_constants and args.gpu_constants.is_file():
        print(f"GPU constants from {args.gpu_constants}")
        return [devices.load_device(args.gpu_constants)]
    return [devices.projected_gpu(kind, measured, args.influence_mfu) for kind in kinds]


def _gpu_kind(device_name: str, fallback: str) -> str:
    name = device_name.lower()
    for kind in ("h200", "h100", "a100"):
        if kind in name:
            return kind
    logger.warning("GPU %r has no spec entry; its peak FLOP/s are taken from --gpu %s", device_name, fallback)
    return fallback


def _preset_config(preset: str, corpus: Any, seq_len: int) -> dict[str, Any]:
    from d3ray.model import ModelConfig, model_config_dict

    return model_config_dict(ModelConfig(preset=preset), corpus.vocab_size, seq_len, corpus.eos_id)


def _device_name(device: str) -> str:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(torch.device(device))
    import os
    import platform

    return f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def _memory_bytes(device: str) -> float:
    if device.startswith("cuda"):
        import torch

        return float(torch.cuda.get_device_properties(torch.device(device)).total_memory)
    import psutil

    return float(psutil.virtual_memory().total)


def _measured_dict(m: Any, snapshots: dict[str, Any]) -> dict[str, Any]:
    out = asdict(m)
    for row, t in zip(out["models"], m.models, strict=True):
        row.update(potential_sec_per_coordinate=t.potential_sec_per_coordinate,
                   drift_sec_per_coordinate=t.drift_sec_per_coordinate, influence_step_ratio=t.influence_step_ratio,
                   potential_model_sec=POTENTIAL_BYTES * t.params / m.copy_bytes_per_sec,
                   drift_model_sec=chunk_coordinate_bytes(MEASURED_LOAD) * t.params / m.copy_bytes_per_sec)
    out["snapshots"] = {p: asdict(s) | {"put_bytes_per_sec": s.put_bytes_per_sec, "get_bytes_per_sec": s.get_bytes_per_sec,
                                        "bytes_per_sec": s.bytes_per_sec} for p, s in snapshots.items()}
    if m.allreduce:
        out["allreduce"] |= {"bytes_per_sec": m.allreduce.bytes_per_sec, "latency_sec": m.allreduce.latency_sec}
    return out


# ---- printing -----------------------------------------------------------------------------------------
def _num(x: float) -> str:
    """3 significant digits without exponents (1,009 rather than 1.01e+03)."""
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _bytes(x: float) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20)):
        if x >= size:
            return f"{_num(x / size)} {unit}"
    return f"{_num(x / 2**10)} KiB"


def _count(n: int) -> str:
    return f"{n / 1e9:.3g}B" if n >= 1e9 else f"{n / 1e6:.3g}M"


def print_measured(m: Any, snapshots: dict[str, Any], L: int = 8) -> None:
    """The measured constants, one line per model, snapshot and collective; the potential and w beside what
    the model prices them at (their bytes at the measured copy bandwidth)."""
    print(f"\n== measured on {m.device}, {m.threads} torch thread(s); the influence drift, residual none, with the "
          "potential from the gradient (the forward+backward the model's influence mfu is fitted on)")
    print(f"{'model':<10}{'d':>12}{'B x T':>8}{'step s':>9}{'infl s/batch':>13}{'ratio':>7}{'fwd+bwd s':>11}"
          f"{'potential ms':>13}{'(model)':>9}{'w ms':>8}{'(model)':>9}{'load s':>8}{f'actor share L={L}':>19}")
    for t in m.models:
        pot_model = POTENTIAL_BYTES * t.params / m.copy_bytes_per_sec
        w_model = chunk_coordinate_bytes(MEASURED_LOAD) * t.params / m.copy_bytes_per_sec
        print(f"{t.model:<10}{t.params:>12,}{f'{t.batch_size}x{t.seq_len}':>8}{t.step_sec:>9.4f}"
              f"{t.influence_sec_per_batch:>13.4f}{t.influence_step_ratio:>7.2f}{t.stats_sec_per_batch:>11.4f}"
              f"{t.potential_sec_per_batch * 1e3:>13.2f}{pot_model * 1e3:>9.2f}{t.drift_sec * 1e3:>8.2f}"
              f"{w_model * 1e3:>9.2f}{t.load_sec:>8.4f}{t.actor_share(L):>19.1%}")
    for preset, s in (snapshots or {"largest": m.snapshot}).items():
        print(f"snapshot {preset} (bfloat16 state dict + m + v, {_bytes(s.bytes)}): ray.put {s.put_bytes_per_sec / 1e9:.2f} "
              f"GB/s, ray.get + widening to fp32 in an actor {s.get_bytes_per_sec / 1e9:.2f} GB/s, both "
              f"{s.bytes_per_sec / 1e9:.2f} GB/s")
    if m.allreduce:
        sizes = ", ".join(f"{n:,} floats {sec * 1e3:.2f} ms" for n, sec in sorted(m.allreduce.sec_by_floats.items()))
        print(f"all-reduce, {m.allreduce.world_size} gloo processes: {sizes} (bus {m.allreduce.bytes_per_sec / 1e9:.2f} GB/s)")
    print(f"memory copy {m.copy_bytes_per_sec / 1e9:.2f} GB/s (read + write): bw_mem of the O(N) work")
    for note in m.notes:
        print(f"note: {note}")


def print_chunk_costs(rows: list[dict[str, Any]], projected: bool) -> None:
    """One chunk, phase by phase, one actor scoring all L batches (``chunk_cost``)."""
    p = "~" if projected else ""
    sec = lambda x: f"{p}{_num(x)}"  # noqa: E731
    ms = lambda x: f"{p}{_num(x * 1e3)}"  # noqa: E731
    _table(
        ["chunk cost", "params", "W", "step s", "chunk s", "snapshot", "publish s", "transfer s", "h2d s", "w ms",
         "fwd+bwd s/batch", "potential ms/batch", "actor s/chunk", "actor share", "batch/step", "infl/train GPU-s",
         "actor mem floor / as coded"],
        [[r["model"], _count(r["params"]), str(r["ranks"]), sec(c["step_sec"]), sec(c["chunk_train_sec"]),
          _bytes(r["snapshot"]["bytes_per_chunk"]), sec(c["publish_sec"]), sec(c["transfer_sec"]),
          sec(c["host_to_device_sec"]), ms(c["drift_sec"]), sec(c["fwd_bwd_sec"]), ms(c["coordinate_sec"]),
          sec(c["actor_sec"]), f"{p}{c['actor_share']:.1%}", f"{p}{c['batch_step_ratio']:.2f}x",
          f"{p}{c['gpu_seconds_ratio']:.2%}",
          f"{_bytes(r['snapshot']['memory_floor_total'])} / {_bytes(r['snapshot']['memory_as_coded_total'])}"]
         for r in rows for c in [r["chunk_cost"]]],
        ["" for _ in rows],
    )


def _table(headers: list[str], rows: list[list[str]], notes: list[str]) -> None:
    """Right-aligned columns as wide as their widest cell; a row's note follows it."""
    widths = [max(len(h), *(len(r[c]) for r in rows)) for c, h in enumerate(headers)]
    print("  ".join(h.rjust(w) if c else h.ljust(w) for c, (h, w) in enumerate(zip(headers, widths, strict=True))))
    for row, note in zip(rows, notes, strict=True):
        line = "  ".join(x.rjust(w) if c else x.ljust(w) for c, (x, w) in enumerate(zip(row, widths, strict=True)))
        print(line + (f"  {note}" if note else ""))


def print_plans(rows: list[dict[str, Any]], projected: bool) -> None:
    """Two tables: snapshot mode, in-trainer mode (``~`` before figures that rest on projections)."""
    p = "~" if projected else ""
    pct = lambda x: f"{p}{x:.1%}"  # noqa: E731
    sec = lambda x: f"{p}{_num(x)}"  # noqa: E731
    frac = lambda x: f"{p}none" if x is None else f"{p}{x:.3g}"  # noqa: E731
    _table(
        ["snapshot", "params", "W", "chunk s", "bytes/chunk", "actor mem", "as coded", "publish s", "batch s",
         "actors", "wait", "busy", "scoring actors"],
        [[r["model"], _count(r["params"]), str(r["ranks"]), sec(s["chunk_train_sec"]), _bytes(s["bytes_per_chunk"]),
          p + _bytes(s["memory_floor_total"]), p + _bytes(s["memory_as_coded_total"]), sec(s["publish_sec"]),
          sec(s["batch_sec"]), f"{p}{s['actors'] or 'none'}", pct(s["wait_fraction"]), sec(s["busy_fraction"]),
          f"{p}{s['scoring_actors'] or 'none'}"]
         for r in rows for s in [r["snapshot"]]],
        [r["snapshot"]["reason"] for r in rows],
    )
    _table(
        ["in-trainer", "W", "out/chunk", "ZeRO-3/rank", "extra mem", "wait s", "wait", "max s",
         "| per chunk: ZeRO-3/rank", "extra mem", "wait", "max s"],
        [[r["model"], str(r["ranks"]), _bytes(t["kvector_bytes_per_chunk"]), _bytes(t["zero3_bytes_per_chunk"]),
          p + _bytes(t["extra_memory_total"]), sec(t["wait_sec"]), pct(t["wait_fraction"]),
          frac(t["max_sample_fraction"]), _bytes(c["zero3_bytes_per_chunk"]), p + _bytes(c["extra_memory_total"]),
          pct(c["wait_fraction"]), frac(c["max_sample_fraction"])]
         for r in rows for t, c in [(r["in_trainer"], r["in_trainer_gather_per_chunk"])]],
        [r["in_trainer"]["reason"] for r in rows],
    )
