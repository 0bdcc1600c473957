"""``d3ray data``: generate the sample corpus, inspect a corpus.

d3ray data sample --out DIR [--seed N] [--train-docs N] [--validation-docs N]
d3ray data inspect PATH [PATH ...] [--tokenizer DIR] [--layout auto] [--domains any] [--text-key text]
                   [--domain-key meta.redpajama_set_name] [--json]
d3ray data sft-sample --out DIR [--seed N] [--train-per-skill N] [--test-per-skill N]
"""

from __future__ import annotations

import argparse

from d3ray.data.config import DEFAULT_DOMAIN_KEY, DEFAULT_DOMAINS, DEFAULT_TEXT_KEY, LAYOUTS


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("data", help="generate a sample corpus or inspect one")
    sub = parser.add_subparsers(dest="data_command", required=True, metavar="ACTION")

    sample = sub.add_parser("sample", help="write the deterministic generated SlimPajama-format corpus")
    sample.add_argument(
        "--out", required=True, help="output folder (train/ and validation/ are created in it)"
    )
    sample.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")
    sample.add_argument("--train-docs", type=int, default=2000, help="training documents (default 2000)")
    sample.add_argument("--validation-docs", type=int, default=280, help="validation documents (default 280)")
    sample.add_argument("--train-shards", type=int, default=4, help="training shard files (default 4)")
    sample.set_defaults(func=_sample)

    sft = sub.add_parser("sft-sample", help="write the generated multi-skill SFT suite (train/ and test/ JSONL)")
    sft.add_argument("--out", required=True, help="output folder (train/, test/ and manifest.json)")
    sft.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")
    sft.add_argument("--train-per-skill", type=int, default=1200, help="training records per skill (default 1200)")
    sft.add_argument("--test-per-skill", type=int, default=200, help="held-out records per skill (default 200)")
    sft.set_defaults(func=_sft_sample)

    insp = sub.add_parser("inspect", help="records, tokens and bad records per domain and per shard")
    insp.add_argument(
        "paths", nargs="+", metavar="PATH",
        help="folder, glob or URI of .jsonl[.zst|.gz], .parquet or .arrow shards (or a saved HF dataset folder)"
    )
    insp.add_argument("--tokenizer", default=None, help="tokenizer directory (default: count words)")
    insp.add_argument("--layout", choices=LAYOUTS, default="auto", help="corpus layout (default auto)")
    insp.add_argument(
        "--domains",
        default=None,
        help="comma-separated known domains, or 'any' (default: as a run finds them: the 7 SlimPajama sets, or "
             "with --layout auto on records without the domain field, one per path or subfolder)",
    )
    insp.add_argument("--text-key", default=DEFAULT_TEXT_KEY, help="the text field, dotted if nested (data.text_key)")
    insp.add_argument("--domain-key", default=DEFAULT_DOMAIN_KEY,
                      help=f"the domain field, dotted if nested (data.domain_key; default {DEFAULT_DOMAIN_KEY})")
    insp.add_argument("--json", action="store_true", help="print JSON instead of a table")
    insp.set_defaults(func=_inspect)


def _sample(args: argparse.Namespace) -> int:
    from d3ray.data.sample import write_sample_corpus

    out = write_sample_corpus(
        args.out,
        seed=args.seed,
        train_docs=args.train_docs,
        validation_docs=args.validation_docs,
        train_shards=args.train_shards,
    )
    print(f"wrote the sample corpus to {out} (train/ and validation/)")
    return 0


def _sft_sample(args: argparse.Namespace) -> int:
    import json

    from d3ray.data.skills import write_sft_suite

    out = write_sft_suite(
        args.out, seed=args.seed, train_per_skill=args.train_per_skill, test_per_skill=args.test_per_skill
    )
    counts = json.loads((out / "manifest.json").read_text())["counts"]
    for split, skills in counts.items():
        print(f"{split}: " + ", ".join(f"{skill} {sum(levels.values())}" for skill, levels in skills.items()))
    print(f"wrote the SFT skill suite to {out} (train/, test/, manifest.json)")
    return 0


def _inspect(args: argparse.Namespace) -> int:
    import sys

    from d3ray.data.report import inspect

    if args.domains == "any":
        report = inspect(args.paths, tokenizer_dir=args.tokenizer, layout=args.layout, domains=None,
                         text_key=args.text_key, domain_key=args.domain_key)
    else:  # the domains as a run finds them
        from d3ray.data.config import DataConfig
        from d3ray.data.corpus import resolve_listing

        domains = DEFAULT_DOMAINS if args.domains is None else [d for d in args.domains.split(",") if d]
        try:
            data = DataConfig(train_paths=list(args.paths), layout=args.layout, domains=list(domains),
                              text_key=args.text_key, domain_key=args.domain_key)
        except ValueError as err:
            from d3ray.errors import UserError

            raise UserError(str(err)) from None
        data, shards, line = resolve_listing(data, "data inspect")
        print(line, file=sys.stderr)
        report = inspect(args.paths, tokenizer_dir=args.tokenizer, layout=data.layout, domains=data.domains,
                         text_key=args.text_key, domain_key=args.domain_key, shards=shards)
    print(report.to_json() if args.json else report.format_table())
    return 0
