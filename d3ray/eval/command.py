"""``d3ray eval MODEL_OR_CHECKPOINT --tasks KIND=FILE[,KIND=FILE...|NAME...] [--include-path DIR] --out results.json``.

A ``--tasks`` item without ``=`` is an lm-eval task name: one of lm-eval's own tasks whose dataset is in
the local Hugging Face cache, or a task of the ``--include-path`` folder (named.py).

MODEL_OR_CHECKPOINT may be a run directory (``runs/<name>``): its newest checkpoint is evaluated, and named.

The task files are read and validated here, in the driver, before any model is loaded, so a bad
file fails at once with its file, line and field. The evaluation itself runs in this process, or
with ``--ray`` as one Ray task (on a cluster: wherever ``--cpus``/``--gpus`` fit); a failure
inside that task is re-raised with the model and task list it was evaluating.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path
from typing import Any


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "eval",
        help="evaluate a model on local task files through lm-evaluation-harness",
        description="Evaluate a d3ray checkpoint, an exported/local Hugging Face model dir or a LoRA "
        "adapter dir. Kinds: ppl (plain text file), domains (SlimPajama-format shards), cloze "
        "({context, continuation} JSONL), choice ({context, choices, label} JSONL), sft (SFT JSONL: "
        "exact match by greedy generation). lm-eval's own task names (e.g. lambada_openai) run when their "
        "data is in the local Hugging Face cache, and your own task YAMLs through --include-path. "
        "Nothing is downloaded.",
    )
    parser.add_argument("model", metavar="MODEL_OR_CHECKPOINT",
                        help="checkpoint dir, run dir (its newest checkpoint), HF model dir or adapter dir")
    parser.add_argument("--tasks", required=True,
                        help="KIND=FILE[,KIND=FILE...] (e.g. cloze=lambada.jsonl) and/or lm-eval task names "
                             "(e.g. lambada_openai, or a task of --include-path) whose data is local")
    parser.add_argument("--include-path", default=None, metavar="DIR",
                        help="a folder of your own lm-eval task YAMLs (lm-eval's include_path); name its tasks "
                             "in --tasks")
    parser.add_argument("--out", default=None, help="write the results JSON here")
    parser.add_argument("--batch-size", type=int, default=64, help="lm-eval requests per forward (default 64)")
    parser.add_argument("--limit", type=int, default=None, help="at most N examples per task (default all)")
    parser.add_argument("--max-docs-per-domain", type=int, default=None, help="domains: documents per domain")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (default 1: fastest for small models on small boxes)")
    parser.add_argument("--ray", action="store_true", help="run the evaluation as a Ray task (local or cluster)")
    parser.add_argument("--cpus", type=float, default=1.0, help="--ray: CPUs of the evaluation task")
    parser.add_argument("--gpus", type=float, default=0.0, help="--ray: GPUs of the evaluation task")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from d3ray.eval.harness import prepare_tasks
    from d3ray.export.load import resolve_model_source

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is fetched: every input is a local file
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    logging.getLogger("lm_eval").setLevel(logging.ERROR)  # per-task notices about defaults we set
    model = str(resolve_model_source(args.model))
    if Path(model) != Path(args.model):
        print(f"{args.model}: evaluating its newest checkpoint {model}", flush=True)
    tokenizer = _tokenizer_of(model)
    items = [t.strip() for t in args.tasks.split(",") if t.strip()]
    files, names = [t for t in items if "=" in t], [t for t in items if "=" not in t]
    prepared = prepare_tasks(",".join(files), tokenizer, args.max_docs_per_domain) if files or not names else []
    if names:
        from d3ray.eval.named import prepare_named_tasks

        prepared += prepare_named_tasks(names, args.include_path)
    if args.ray:
        import ray

        remote = ray.remote(evaluate_model_path).options(num_cpus=args.cpus, num_gpus=args.gpus)
        report = ray.get(remote.remote(model, prepared, args.batch_size, args.limit, args.threads))
    else:
        report = evaluate_model_path(model, prepared, args.batch_size, args.limit, args.threads)
    result = {"model": model, "tasks": args.tasks, **report}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    from d3ray.eval.harness import EvalReport

    print(EvalReport(metrics=report["metrics"]).format_table())
    print(f"{sum(report['examples'].values())} examples in {report['seconds']:.1f} s"
          + (f"; results in {args.out}" if args.out else ""))
    return 0


def _tokenizer_of(path: str) -> Any:
    from d3ray.data.tokenizer import load_tokenizer
    from d3ray.export.load import model_source_kind

    kind = model_source_kind(path)
    return load_tokenizer(Path(path) / "tokenizer" if kind == "checkpoint" else path)


def evaluate_model_path(model_path: str, prepared: list, batch_size: int, limit: int | None, threads: int) -> dict:
    """Load the model and run the prepared tasks; in this process or as a Ray task (plain function)."""
    import torch

    from d3ray.eval.harness import evaluate_tasks
    from d3ray.export.load import load_model

    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    torch.set_num_threads(threads)
    names = [t.task.name for t in prepared]
    try:
        loaded = load_model(model_path)
        if torch.cuda.is_available():
            loaded.model.to("cuda")
        return evaluate_tasks(loaded.model, loaded.tokenizer, prepared, batch_size, limit).to_dict()
    except Exception as err:  # add what was being evaluated, then re-raise
        raise RuntimeError(f"evaluating {model_path} on {names} failed: {err}") from err
