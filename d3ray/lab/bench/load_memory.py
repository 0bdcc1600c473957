"""``d3ray bench load-memory``: peak host RSS of each rank while N ranks load a model under ZeRO-3.

    whole         build_model(config, cfg), then deepspeed.initialize (which partitions it): every rank
                  holds the whole model first (d3ray before #31)
    partitioned   build_model(config, cfg, ds_config): transformers constructs the model inside
                  deepspeed.zero.Init (HfDeepSpeedConfig), each rank keeps only its shard

each for a random init (``from_config``) and for a pretrained directory (``from_pretrained`` of the same
model, saved first). Every (source, mode) runs in fresh rank processes (a peak only grows), started with
``torch.multiprocessing`` (spawn; gloo, ``DS_ACCELERATOR=cpu``, fp32, one thread each), the trainers'
DeepSpeed config (``deepspeed_config`` of a ZeRO-3 ``TrainConfig``). Reported per rank, in MiB: the
resident set after the imports (torch, transformers, DeepSpeed, the process group), then the peak
resident set (``VmHWM``, restarted after the imports) after the build and after ``deepspeed.initialize``,
and the resident set held after it.

    partitioned_over_whole = partitioned peak ÷ whole peak, per rank (after deepspeed.initialize)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

MODES = ("whole", "partitioned")
SOURCES = ("random", "pretrained")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--preset", default="gpt2-124m", help="model preset (d3ray/model/causal_lm.py; default gpt2-124m)")
    parser.add_argument("--vocab", type=int, default=50257, help="vocabulary size (default 50257, GPT-2's: 124M)")
    parser.add_argument("--seq-len", type=int, default=1024, help="context length (default 1024)")
    parser.add_argument("--ranks", type=int, default=2, help="ranks (processes) loading the model (default 2)")
    parser.add_argument("--sources", default=",".join(SOURCES), help="random,pretrained (default both)")


def rss_mib(field: str = "VmHWM") -> float:
    """This process's peak (``VmHWM``) or current (``VmRSS``) resident set, from ``/proc/self/status``.
    Not ``ru_maxrss``: a spawned process inherits in it the peak of the parent it was forked from."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def reset_peak() -> None:
    """Start the peak (``VmHWM``) over from the current resident set (Linux ``clear_refs`` 5)."""
    Path("/proc/self/clear_refs").write_text("5")


def _rank(rank: int, world: int, port: int, mode: str, pretrained: str | None, preset: str, vocab: int,
          seq_len: int, results: Any) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), DS_ACCELERATOR="cpu")
    import torch

    from d3ray.deepspeed_import import import_deepspeed
    from d3ray.model import ModelConfig, build_model, model_config_dict
    from d3ray.train.config import TrainConfig
    from d3ray.train.deepspeed_config import deepspeed_config

    deepspeed = import_deepspeed()

    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    imported = rss_mib("VmRSS")
    reset_peak()  # the imports' own transient peak is not the load's
    cfg = ModelConfig(preset=preset, pretrained_path=pretrained)
    config = model_config_dict(cfg, vocab, seq_len, 0)
    ds = deepspeed_config(TrainConfig(zero_stage=3, num_workers=world, global_batch_size=world, micro_batch_size=1,
                                      precision="fp32"))
    torch.manual_seed(0)
    start = time.perf_counter()
    model = build_model(config, cfg, ds if mode == "partitioned" else None)
    built, build_s = rss_mib(), time.perf_counter() - start
    engine, *_ = deepspeed.initialize(model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
                                      config=ds)
    values = sum(p.ds_numel for p in engine.module.parameters())
    results.put({"rank": rank, "imports_mib": round(imported, 1), "after_build_mib": round(built, 1),
                 "after_initialize_mib": round(rss_mib(), 1), "held_after_initialize_mib": round(rss_mib("VmRSS"), 1),
                 "build_s": round(build_s, 2), "parameters": values, "total_s": round(time.perf_counter() - start, 2)})


def measure(mode: str, pretrained: str | None, args: argparse.Namespace) -> list[dict[str, Any]]:
    """One load by ``args.ranks`` fresh processes; each rank's figures, by rank."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [ctx.Process(target=_rank, args=(r, args.ranks, port, mode, pretrained, args.preset, args.vocab,
                                             args.seq_len, results)) for r in range(args.ranks)]
    for p in procs:
        p.start()
    rows = [results.get(timeout=900) for _ in procs]
    for p in procs:
        p.join()
        if p.exitcode:
            raise RuntimeError(f"a rank exited with {p.exitcode}")
    return sorted(rows, key=lambda r: r["rank"])


def run(args: argparse.Namespace) -> int:
    import torch

    from d3ray.model import ModelConfig, build_model, model_config_dict

    sources = [s for s in args.sources.split(",") if s]
    report: dict[str, Any] = {"preset": args.preset, "vocab": args.vocab, "seq_len": args.seq_len,
                              "ranks": args.ranks, "loads": {}}
    with tempfile.TemporaryDirectory() as tmp:
        pretrained = None
        if "pretrained" in sources:
            pretrained = str(Path(tmp) / "model")
            cfg = ModelConfig(preset=args.preset)
            torch.manual_seed(0)
            build_model(model_config_dict(cfg, args.vocab, args.seq_len, 0), cfg).save_pretrained(pretrained)
        for source in sources:
            for mode in MODES:
                rows = measure(mode, pretrained if source == "pretrained" else None, args)
                report["loads"][f"{source}/{mode}"] = rows
                print(f"{source:10s} {mode:11s} " + " | ".join(
                    f"rank {r['rank']}: imports {r['imports_mib']:.0f} MiB, peak: build {r['after_build_mib']:.0f}, "
                    f"initialize {r['after_initialize_mib']:.0f}, held {r['held_after_initialize_mib']:.0f}"
                    for r in rows), flush=True)
            whole, part = report["loads"][f"{source}/whole"], report["loads"][f"{source}/partitioned"]
            report[f"{source}_partitioned_over_whole"] = [
                round(p["after_initialize_mib"] / w["after_initialize_mib"], 3) for w, p in zip(whole, part, strict=True)]
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0
