"""``d3ray pretrain`` and ``d3ray finetune``: run (or resume) a training job on a local or existing Ray cluster."""

from __future__ import annotations

import argparse
from pathlib import Path

from d3ray.run.defaults import FINETUNE_DEFAULTS

#: The config sections ``--help`` lists (kept equal to RunConfig's sections by a test).
CONFIG_SECTIONS = {
    "data": "corpus paths, layout, text/domain keys, domains, sequence length, tokenizer, bad-record limits",
    "model": "architecture preset, pretrained_path, overrides, LoRA, attention kernel",
    "train": "steps, batch sizes, workers, GPUs, ZeRO stage, optimizer, eval and checkpoint cadence",
    "eval": "held-out sequences per domain, out-of-domain files, SFT sets, lm-eval tasks",
    "schedule": "the data scheduler: type (d3, random, curriculum, odm, ...) and its knobs",
    "sft": "fine-tuning records (paths, format: d3ray/alpaca/sharegpt, columns, seq_len, batching); finetune sets it",
    "ray": "cluster address, local CPUs, Ray Train poll interval",
}
CONFIG_SECTIONS_HELP = (
    "config sections (override any field as --SECTION.KEY=VALUE, or in a --config file):\n"
    + "\n".join(f"  {name:<9} {text}" for name, text in CONFIG_SECTIONS.items())
    + "\n  (run level: name, seed, output_dir, storage_path)\n\n"
    "d3ray config show [--config F] [--key=value ...] prints the resolved config with each field's doc line;\n"
    "d3ray schedulers NAME lists a scheduler's knobs."
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "pretrain",
        help="pre-train a causal LM with a data scheduler (default: tiny GPT-2, D3 order, sample data)",
        description="Run a pre-training job. Without --config, the tiny default runs on generated sample "
        "data. Dotted overrides follow: --train.steps=200 --schedule.type=random.",
        epilog=CONFIG_SECTIONS_HELP, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", help="values-only YAML file (see jobs/configs/)")
    parser.set_defaults(func=run_pretrain_command, accepts_overrides=True)

    sft = subparsers.add_parser(
        "finetune",
        help="supervised fine-tuning (full or LoRA) with a data scheduler (default: tiny GPT-2, skill suite)",
        description="Fine-tune on {prompt, response, task} JSONL records, loss on the response only. Without "
        "--config, the tiny default runs on the generated skill suite. --from starts from a d3ray checkpoint, "
        "a run directory (its newest checkpoint) or a local Hugging Face model directory; --model.lora={r: 8} trains LoRA adapters only.",
        epilog=CONFIG_SECTIONS_HELP, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sft.add_argument("--config", help="values-only YAML file (see jobs/configs/); it must set sft:")
    sft.add_argument("--from", dest="init", metavar="PATH",
                     help="a d3ray checkpoint, a run directory (its newest checkpoint) or a local Hugging Face "
                     "model directory to start from")
    sft.set_defaults(func=run_finetune_command, accepts_overrides=True)


def run_pretrain_command(args: argparse.Namespace) -> int:
    from d3ray.config import RunConfig
    from d3ray.config_loading import load_config
    from d3ray.run.pretrain import run_pretrain

    final = run_pretrain(load_config(RunConfig, args.config, args.overrides))
    print_final_checkpoint(final)
    return 0


def run_finetune_command(args: argparse.Namespace) -> int:
    import dataclasses

    from d3ray.config import RunConfig
    from d3ray.config_loading import load_config
    from d3ray.errors import UserError
    from d3ray.export.start import start_from
    from d3ray.run.pretrain import run_pretrain

    defaults = [] if args.config else FINETUNE_DEFAULTS
    cfg = load_config(RunConfig, args.config, [*defaults, *args.overrides])
    if cfg.sft is None:
        raise UserError(f"{args.config}: a fine-tuning config needs an `sft:` section (the SFT records)")
    if args.init:
        cfg = start_from(cfg, Path(args.init))
    final = run_pretrain(dataclasses.replace(cfg))
    print_final_checkpoint(final)
    return 0


def print_final_checkpoint(final: dict) -> None:
    """One line naming the run's last checkpoint (what ``d3ray export`` / ``eval`` / ``finetune --from`` take;
    the run directory itself works too: it means its newest checkpoint)."""
    if final.get("checkpoint"):
        print(f"checkpoint: {final['checkpoint']}", flush=True)
