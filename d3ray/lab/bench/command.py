"""``d3ray bench {solver,influence,influence-capacity,pipeline,step,finetune,eval,data,load-memory}``: benchmarks run side by side with their baseline in
one process, reported as ratios, written as JSON (``--out FILE.json``)."""

from __future__ import annotations

import argparse
import importlib

#: CLI name → (module of d3ray.lab.bench, help).
BENCHMARKS = {
    "solver": ("solver", "ordering solvers vs RSR and the exact optimum on planted, random and influence S"),
    "influence": ("influence", "influence estimators and sketches: cost vs a training step, fidelity vs the reference"),
    "influence-capacity": ("influence_capacity", "measured influence constants and the capacity model from 124M to "
                           "70B: memory, bytes and trainer wait per chunk, snapshot vs in-trainer mode"),
    "pipeline": ("pipeline", "a D3 run vs a random-order run on the same tokens: throughput ratio, trainer wait"),
    "step": ("step", "one training step unweighted vs under loss reweighting, interleaved in one process: "
             "step time ratio and phases"),
    "finetune": ("finetune", "LoRA vs full fine-tuning of the small model on the same SFT tokens: step time ratio"),
    "eval": ("eval", "1,000-example cloze and multiple-choice tasks on the tiny model through lm-eval: seconds vs 60 s"),
    "data": ("data", "the data stream (plain and mixed, 1 and N actors) vs a plain loop: tokens/s, resume, epoch gap"),
    "load-memory": ("load_memory", "peak host RSS per rank loading a model under ZeRO-3 on N ranks: built whole on "
                    "every rank vs partitioned at construction (zero.Init)"),
}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("bench", help="benchmarks (JSON out, ratios against a baseline)")
    sub = parser.add_subparsers(dest="bench", required=True, metavar="BENCH")
    for name, (module_name, help_text) in BENCHMARKS.items():
        module = importlib.import_module(f"d3ray.lab.bench.{module_name}")
        bench = sub.add_parser(name, help=help_text)
        module.add_arguments(bench)
        bench.set_defaults(func=module.run)
