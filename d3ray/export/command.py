"""``d3ray export CHECKPOINT --out DIR [--lora merged|adapter]``: a Hugging Face model directory."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "export",
        help="write a Hugging Face model dir (safetensors, config, tokenizer) from a d3ray checkpoint",
        description="Export a d3ray checkpoint directory (DeepSpeed ZeRO 0-3, full or LoRA), a LoRA "
        "adapter dir or a local Hugging Face model dir as a Hugging Face model directory that "
        "transformers.AutoModelForCausalLM.from_pretrained loads.",
    )
    parser.add_argument("checkpoint", metavar="CHECKPOINT", help="d3ray checkpoint dir (runs/<name>/checkpoint_*)")
    parser.add_argument("--out", required=True, help="output directory (replaced if it exists)")
    parser.add_argument(
        "--lora",
        choices=("merged", "adapter"),
        default="merged",
        help="LoRA models: merge the adapter into the weights (default) or save it as an adapter "
        "(out/ holds the adapter, out/base/ the base model)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from d3ray.export.write import export_model

    out = export_model(args.checkpoint, args.out, lora=args.lora)
    print(f"exported {args.checkpoint} to {out}")
    return 0
