"""``d3ray bench eval``: seconds for a 1,000-example cloze and multiple-choice task on the tiny model.

The issue's target: either task in < 60 s on 2 CPU cores. The model is the ``gpt2-tiny`` preset at
the default context (T = 128) with a BPE tokenizer trained on the generated sample corpus, as
``d3ray pretrain`` builds them; the tasks are cut from that corpus' validation documents in the
task layouts (cloze: about 60 words of context and the next word, LAMBADA-like; choice: about 40
words of context and 4 endings of 12-20 words, one true, HellaSwag-like) and run through the
same ``d3ray eval`` path (files → validation → lm-eval with HFLM). Reported: wall and CPU seconds
per task and their ratio to the 60 s budget; random weights (scoring cost does not depend on them).
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import tempfile
import time
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

BUDGET_S = 60.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``d3ray bench eval``."""
    parser.add_argument("--out", type=Path, default=None, help="write the JSON results here")
    parser.add_argument("--examples", type=int, default=1000, help="examples per task (default 1000)")
    parser.add_argument("--batch-size", type=int, default=64, help="lm-eval requests per forward (default 64)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="corpus and task seed")


def _words(corpus_dir: Path) -> list[list[str]]:
    from d3ray.data.records import iter_documents
    from d3ray.data.shards import list_shards

    docs = []
    for shard in list_shards([str(corpus_dir / "validation")]):
        docs += [d.text.split() for d in iter_documents(shard, "auto", None) if not d.is_bad]
    return [d for d in docs if len(d) >= 80]


def write_tasks(docs: list[list[str]], n: int, seed: int, out: Path) -> tuple[Path, Path]:
    """``cloze.jsonl`` and ``choice.jsonl`` with ``n`` examples each, cut from ``docs``."""
    rng = random.Random(seed)
    cloze, choice = [], []
    for _ in range(n):
        doc = rng.choice(docs)
        start = rng.randint(0, len(doc) - 61)
        cloze.append({"context": " ".join(doc[start : start + 60]), "continuation": doc[start + 60]})
        doc = rng.choice(docs)
        start = rng.randint(0, len(doc) - 41)
        endings = [(True, " ".join(doc[start + 40 : start + 40 + rng.randint(12, 20)]))]
        for _ in range(3):
            other = rng.choice(docs)
            s = rng.randint(0, len(other) - 20)
            endings.append((False, " ".join(other[s : s + rng.randint(12, 20)])))
        rng.shuffle(endings)
        label = [is_true for is_true, _ in endings].index(True)
        choice.append({"context": " ".join(doc[start : start + 40]), "choices": [e for _, e in endings],
                       "label": label})
    paths = out / "cloze.jsonl", out / "choice.jsonl"
    for path, rows in zip(paths, (cloze, choice), strict=True):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return paths


def run(args: argparse.Namespace) -> int:
    import torch

    from d3ray.data.config import DataConfig
    from d3ray.data.sample import write_sample_corpus
    from d3ray.data.shards import list_shards
    from d3ray.data.tokenizer import load_tokenizer, train_tokenizer
    from d3ray.eval.harness import evaluate_tasks, prepare_tasks
    from d3ray.model import ModelConfig, build_model, model_config_dict

    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    torch.set_num_threads(args.threads)
    results: dict[str, Any] = {"examples": args.examples, "batch_size": args.batch_size, "threads": args.threads,
                               "budget_s": BUDGET_S, "model": "gpt2-tiny", "seq_len": 128}
    with tempfile.TemporaryDirectory() as tmp:
        root = write_sample_corpus(Path(tmp) / "corpus", seed=args.seed)
        cfg = DataConfig(train_paths=[str(root / "train")])
        tok = load_tokenizer(train_tokenizer(list_shards(cfg.train_paths), cfg, Path(tmp) / "tokenizer"))
        mcfg = ModelConfig(preset="gpt2-tiny")
        torch.manual_seed(args.seed)
        model = build_model(model_config_dict(mcfg, len(tok), 128, tok.eos_token_id), mcfg).eval()
        cloze, choice = write_tasks(_words(root), args.examples, args.seed, Path(tmp))
        for kind, path in (("cloze", cloze), ("choice", choice)):
            wall, cpu = time.perf_counter(), time.process_time()
            prepared = prepare_tasks(f"{kind}={path}", tok)
            report = evaluate_tasks(model, tok, prepared, batch_size=args.batch_size)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            results[kind] = {"wall_s": wall, "cpu_s": cpu, "ratio_to_budget": wall / BUDGET_S,
                             "examples_per_s": args.examples / wall, "metrics": report.metrics}
            print(f"{kind}: {args.examples} examples in {wall:.1f} s wall ({cpu:.1f} s CPU), "
                  f"{wall / BUDGET_S:.2f}x the {BUDGET_S:.0f} s budget")
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0
