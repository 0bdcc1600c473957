"""``d3ray bench step``: what loss weighting adds to one training step, measured in one process.

The step of ``d3ray/train/loop.py`` (forward, :func:`d3ray.model.lm_loss.sequence_losses`, the loss weights of
:func:`d3ray.train.loop.micro_weights`, :func:`d3ray.model.lm_loss.step_loss`, backward, AdamW) on the run's
model preset, once unweighted (random order) and once under loss reweighting (Sow et al. 2025, the
in-step rule ``linupper``), the two alternating step by step on the same batch so that whatever else
the machine does falls on both alike. ``d3ray bench pipeline --scheduler loss_reweight`` measures the
same thing end to end, but two whole runs apart: on a shared 2-core box its run-to-run spread (±5-10%
per run) hides a difference this small.

    weighted_step_ratio = mean weighted step ÷ mean unweighted step   (target < 1.03)

Phases (ms per step): forward, per-sequence loss, weights + step loss, backward, optimizer.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

PHASES = ("forward", "loss", "weights_and_step_loss", "backward", "optimizer")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--preset", default="gpt2-tiny", help="model preset (d3ray/model/causal_lm.py; default gpt2-tiny)")
    parser.add_argument("--micro-batch", type=int, default=4, help="sequences per step (default 4, the run default)")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per sequence (default 128)")
    parser.add_argument("--vocab", type=int, default=4096, help="vocabulary size (default 4096, the run default)")
    parser.add_argument("--steps", type=int, default=300, help="measured steps of each kind (default 300)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: a Ray CPU worker's)")


def run(args: argparse.Namespace) -> int:
    import torch

    from d3ray.model import ModelConfig, build_model, model_config_dict
    from d3ray.model.lm_loss import sequence_losses, step_loss
    from d3ray.schedule.coordinator import DecidedChunk
    from d3ray.schedule.scheduler import ChunkDecision, LossWeighting
    from d3ray.train.loop import micro_weights

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model_cfg = ModelConfig(preset=args.preset)
    model = build_model(model_config_dict(model_cfg, args.vocab, args.seq_len, 0), model_cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.as_tensor(np.random.default_rng(0).integers(0, args.vocab, (args.micro_batch, args.seq_len)))
    rows = slice(0, args.micro_batch)
    def decided(rule: LossWeighting | None) -> DecidedChunk:  # one position; no batch refs (the batch is local)
        return DecidedChunk(chunk_id=0, epoch=0, batch_refs=(), sample_ids=(), domains=(), sample_weights=None,
                            loss_weighting=rule, skipped={}, decision=ChunkDecision(order=(0,)))

    kinds = {"unweighted": decided(None), "weighted": decided(LossWeighting("linupper", {"delta": 1.0,
                                                                                       "temperature": 1.0}))}

    spread: dict[str, float] = {}  # kind -> max/min of its last step's loss weights (1 = unweighted)

    def step(chunk: DecidedChunk, name: str) -> np.ndarray:
        t = [time.perf_counter()]
        logits = model(input_ids=ids).logits
        t.append(time.perf_counter())
        sums, counts = sequence_losses(logits, ids)
        seq_loss = (sums / counts.clamp(min=1.0)).detach()
        t.append(time.perf_counter())
        weights = micro_weights(chunk, 0, rows, seq_loss)
        loss = step_loss(sums, counts, weights)
        t.append(time.perf_counter())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        t.append(time.perf_counter())
        optimizer.step()
        t.append(time.perf_counter())
        spread[name] = 1.0 if weights is None else float(weights.max() / weights.min())
        return np.diff(t)

    for _ in range(10):  # warm-up of both paths
        for name, chunk in kinds.items():
            step(chunk, name)
    phases = {name: np.zeros((args.steps, len(PHASES))) for name in kinds}
    for i in range(args.steps):
        order = list(kinds) if i % 2 == 0 else list(reversed(kinds))  # alternate which goes first
        for name in order:
            phases[name][i] = step(kinds[name], name)
    report = {"preset": args.preset, "micro_batch": args.micro_batch, "seq_len": args.seq_len, "vocab": args.vocab,
              "steps": args.steps, "threads": args.threads}
    for name, p in phases.items():
        total = p.sum(axis=1)
        report[name] = {"mean_step_ms": 1e3 * float(total.mean()), "median_step_ms": 1e3 * float(np.median(total)),
                        "weight_spread": spread[name],  # max/min loss weight of the last step: what was timed
                        **{f"{phase}_ms": 1e3 * float(p[:, k].mean()) for k, phase in enumerate(PHASES)}}
    report["weighted_step_ratio"] = report["weighted"]["mean_step_ms"] / report["unweighted"]["mean_step_ms"]
    report["weighted_median_step_ratio"] = report["weighted"]["median_step_ms"] / report["unweighted"]["median_step_ms"]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    for name in kinds:
        r = report[name]
        print(f"{name:<11} {r['mean_step_ms']:7.2f} ms/step (median {r['median_step_ms']:.2f}) | "
              + " ".join(f"{phase} {r[f'{phase}_ms']:.3f}" for phase in PHASES))
    print(f"weighted_step_ratio {report['weighted_step_ratio']:.4f} (median {report['weighted_median_step_ratio']:.4f};"
          f" target < 1.03) | wrote {args.out}")
    return 0
