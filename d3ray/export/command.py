"""``d3ray export CHECKPOINT --out DIR [--lora merged|adapter] [--dtype fp32|bf16]``: a Hugging Face model directory.

CHECKPOINT may be a run directory (``runs/<name>``): its newest checkpoint is exported, and named."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "export",
        help="write a Hugging Face model dir (safetensors, config, tokenizer) from a d3ray checkpoint",
        description="Export a d3ray checkpoint directory (DeepSpeed ZeRO 0-3, full or LoRA), a LoRA "
        "adapter dir or a local Hugging Face model dir as a Hugging Face model directory that "
        "transformers.AutoModelForCausalLM.from_pretrained loads.",
    )
    parser.add_argument("checkpoint", metavar="CHECKPOINT",
                        help="d3ray checkpoint dir, or a run dir (runs/<name>: its newest checkpoint)")
    parser.add_argument("--out", required=True,
                        help="output directory: new, empty or a previous export (replaced); any other is refused")
    parser.add_argument(
        "--lora",
        choices=("merged", "adapter"),
        default="merged",
        help="LoRA models: merge the adapter into the weights (default) or save it as an adapter "
        "(out/ holds the adapter, out/base/ the base model)",
    )
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                        help="the dtype of the written weights: fp32 (default, the trainers' master weights) or "
                        "bf16 (half the bytes)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from d3ray.export.load import resolve_model_source
    from d3ray.export.write import export_model

    source = resolve_model_source(args.checkpoint)
    if source != Path(args.checkpoint):
        print(f"{args.checkpoint}: exporting its newest checkpoint {source}", flush=True)
    out = export_model(source, args.out, lora=args.lora, dtype=args.dtype)
    print(f"exported {source} to {out}")
    return 0
