"""``d3ray bench finetune``: LoRA against full fine-tuning of the same model on the same SFT tokens.

Two ``d3ray finetune`` runs through the same driver on one Ray instance, one after the other (full
fine-tuning, then ``model.lora``), both on the small GPT-2 preset and the generated skill suite;
reported: the mean (and median) step time of each and their ratio (target: LoRA at least 2x faster per
step).
A step is forward, backward and the optimizer step of the whole global batch; LoRA saves the
weight gradients and optimizer state of the frozen base, not its forward and input-gradient work.

Beside the two runs, ``plain_torch``: the same two models' forward, backward and AdamW step on one
micro-batch in this process (one thread, no Ray, no DeepSpeed), the ratio that the work LoRA skips
allows by itself; what the runs add beyond it is DeepSpeed's per-parameter work (gradient reduction,
the partitioned optimizer step), which LoRA's few trainable parameters also avoid.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--work-dir", default="runs/bench_finetune", help="where the two runs are written")
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps of each run")
    parser.add_argument("--preset", default="gpt2-small", help="model preset")
    parser.add_argument("--lora", default="{r: 8}", help="the LoRA config of the second run (YAML)")
    parser.add_argument("--quick", action="store_true", help="8 steps, the tiny model (a smoke test)")
    parser.add_argument("--plain-steps", type=int, default=12,
                        help="timed steps of the plain-torch reference (0: skip it)")
    parser.add_argument("overrides", nargs="*", help="extra dotted overrides for both runs (key=value)")


def run(args: argparse.Namespace) -> int:
    from d3ray.config import RunConfig
    from d3ray.config_loading import load_config
    from d3ray.lab.bench.pipeline import _summarise
    from d3ray.run.cluster import start_ray, worker_env
    from d3ray.run.defaults import FINETUNE_DEFAULTS

    steps, preset = (8, "gpt2-tiny") if args.quick else (args.steps, args.preset)
    work = Path(args.work_dir).resolve()
    common = [*FINETUNE_DEFAULTS, f"--output_dir={work}", f"--train.steps={steps}", f"--model.preset={preset}",
              "--schedule.type=random", "--eval.tasks=", "--eval.max_sequences_per_domain=2",
              *[f"--{o}" for o in args.overrides]]
    # names last: FINETUNE_DEFAULTS names its run too, and two runs of one name would share a directory
    configs = {"full": load_config(RunConfig, None, [*common, "--name=full"]),
               "lora": load_config(RunConfig, None, [*common, f"--model.lora={args.lora}", "--name=lora"])}
    for cfg in configs.values():
        if any(cfg.run_dir.glob("checkpoint_*")):
            raise SystemExit(f"{cfg.run_dir} holds an earlier run; remove it or pass another --work-dir")
    plain = {}
    if args.plain_steps > 0:
        print(f"== plain torch, one thread: {args.plain_steps} steps each of full and LoRA", flush=True)
        plain = plain_torch_reference(configs, args.plain_steps)
    owns_ray = start_ray(configs["full"].ray, worker_env(configs["full"]))
    results = {}
    try:
        from d3ray.run.pretrain import run_pretrain

        for label, cfg in configs.items():
            print(f"== {label}: {steps} steps, {preset}", flush=True)
            results[label] = _summarise(cfg.run_dir, run_pretrain(cfg), cfg.schedule.L)
            results[label]["median_step_sec"] = median_step_sec(cfg.run_dir)
    finally:
        if owns_ray:
            import ray

            ray.shutdown()
    ratio = results["full"]["mean_step_sec"] / results["lora"]["mean_step_sec"]
    median_ratio = results["full"]["median_step_sec"] / results["lora"]["median_step_sec"]
    report = {"steps": steps, "preset": preset, "lora": args.lora, **results,
              "lora_speedup_per_step": ratio, "lora_speedup_per_step_median": median_ratio,
              "plain_torch": plain,
              "target": {"lora_speedup_per_step": ">= 2.0"}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"mean step: full {results['full']['mean_step_sec']:.3f}s, lora {results['lora']['mean_step_sec']:.3f}s "
          f"-> LoRA {ratio:.2f}x faster per step (target >= 2.0); median step: full "
          f"{results['full']['median_step_sec']:.3f}s, lora {results['lora']['median_step_sec']:.3f}s -> "
          f"{median_ratio:.2f}x; wrote {args.out}")
    if plain:
        print(f"plain torch (one thread, no DeepSpeed), median step: full {plain['full']['median_step_sec']:.3f}s, "
              f"lora {plain['lora']['median_step_sec']:.3f}s -> {plain['lora_speedup_per_step_median']:.2f}x")
    return 0


def median_step_sec(run_dir: Path) -> float:
    """The median step time of a run (``time/step_sec`` of metrics.jsonl): next to the mean, the figure
    that one slow step (a neighbour's burst on a shared box, the first step's warm-up) does not move."""
    import numpy as np

    from d3ray.run_files import read_jsonl

    return float(np.median([r["time/step_sec"] for r in read_jsonl(run_dir / "metrics.jsonl")
                            if r.get("time/step_sec") is not None]))


def plain_torch_reference(configs: dict, steps: int) -> dict:
    """Median seconds of forward / backward / AdamW step of each config's model on one micro-batch of
    random tokens, in this process on one thread, and the full ÷ LoRA ratio of the medians."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = {label: _plain_torch_steps(cfg, steps) for label, cfg in configs.items()}
    finally:
        torch.set_num_threads(threads)
    out["lora_speedup_per_step_median"] = out["full"]["median_step_sec"] / out["lora"]["median_step_sec"]
    return out


def _plain_torch_steps(cfg, steps: int) -> dict[str, float]:
    import time

    import numpy as np
    import torch

    from d3ray.model import build_model, model_config_dict

    vocab, seq_len = cfg.data.tokenizer.vocab_size, cfg.data.seq_len
    torch.manual_seed(0)
    model = build_model(model_config_dict(cfg.model, vocab, seq_len, eos_id=0), cfg.model)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.train.lr)
    ids = torch.randint(0, vocab, (cfg.train.micro_batch_size, seq_len))
    phases = {"forward": [], "backward": [], "optimizer": []}
    for step in range(steps + 2):  # two untimed warm-up steps
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        if step >= 2:
            for name, sec in zip(phases, (t1 - t0, t2 - t1, t3 - t2), strict=True):
                phases[name].append(sec)
    totals = np.sum([phases[name] for name in phases], axis=0)
    return {"median_step_sec": float(np.median(totals)),
            **{f"median_{name}_sec": float(np.median(v)) for name, v in phases.items()},
            "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad)}
