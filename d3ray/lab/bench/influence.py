"""``d3ray bench influence``: the fidelity/cost frontier of the influence estimators.

For the project's GPT-2 presets (``gpt2-tiny``, ``gpt2-small`` of :mod:`d3ray.model`), trained with the
trainers' AdamW on real RedPajama text read by :mod:`d3ray.data` (``influence_setup.py``), at weights
after each ``--train-steps`` (e.g. 100 and 1,000; trained once and cached under ``--workdir``):

- reference: the exact look-ahead A[i, j] = ℓ(B_j; θ + Δθ_i) − ℓ(B_j; θ) with the SAME optimizer as
  training (Δθ_i = one AdamW step from the snapshot's optimizer state), on whole batches, all
  parameters, float32 (``--reference-dtype``; under the AdamW step S is O(lr) and float32 orders
  exactly like float64: measured on tiny @1000, 3 chunks of 8, Spearman 1.00, regret 0.00);
- every estimator variant: first_order, fisher, gnb, hutchinson with 1/2/4/8 probes (the first n of
  8 probes: the draws of an n-probe call), each with preconditioner ``none`` (−γ·g) and ``adam``, at
  each ``--sample-fractions`` × ``--param-filters``, through the production path
  (:func:`~d3ray.influence.chunk.sketch_chunk`, sjlt sketch of ``--k`` with the control variate,
  reference = the previous chunk's means); plus ``*_shared``: one Hessian diagonal per chunk (the
  chunk mean of h) reused for every batch, costed as g per batch + the h estimate once per chunk;
- fidelity per chunk of L = 16 batches and per half chunk (L = 8): Spearman of S's off-diagonal
  entries and the normalised order regret, with σ from the exact solver
  (:func:`d3ray.solver.exact.solve_exact`),

      regret = (cost_ref(σ_est) − cost_ref(σ_ref)) / (E_random cost_ref(σ) − cost_ref(σ_ref))

  (0 = as good as ordering with the reference, 1 = no better than a random order; an all-zero S
  keeps the initial order); ``sketch_regret`` is the regret against the full-dimension S of the same
  variant (the sketch's own error);
- cost: worker seconds per scored batch (float32, a fresh spawned process) / seconds of one training
  step (forward + backward + AdamW, float32) timed in that same process.

``--snapshot-dtype`` runs another section instead: the bytes and the S fidelity of the bfloat16
weights snapshot the trainers ship against a float32 one (``influence_snapshot.py``).

This module is the command: its options, the loop over models and weights, the table. The parts:
``influence_setup.py`` (text and trained weights), ``influence_variants.py`` (what is scored),
``influence_fidelity.py`` (S against the reference), ``influence_cost.py`` (seconds per batch).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from d3ray.lab.bench.influence_cost import attach_costs, cost_variants
from d3ray.lab.bench.influence_fidelity import chunk_scores, fidelity_record, merge_scores, score_variants
from d3ray.lab.bench.influence_setup import (
    DEFAULT_DATA,
    load_corpus,
    mixed_batches,
    model_config,
    trained_weights,
)
from d3ray.lab.bench.influence_snapshot import bench_snapshot_dtype, print_snapshot_table
from d3ray.lab.bench.influence_variants import ESTIMATORS, estimator_families, variants

logger = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``d3ray bench influence``."""
    parser.add_argument("--out", type=Path, help="write the records as JSON here")
    parser.add_argument("--quick", action="store_true", help="tiny model, 20 steps, 2 chunks of 4: a smoke run")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="SlimPajama-layout sample (train/, validation/)")
    parser.add_argument("--workdir", type=Path, default=Path("runs/bench_influence"), help="tokenizer + weights cache")
    parser.add_argument("--models", default="tiny,small", help="comma list of: tiny, small")
    parser.add_argument("--train-steps", default="100,1000", help="AdamW steps before measuring (comma list)")
    parser.add_argument("--schedule-steps", type=int, default=2000, help="cosine LR horizon of the training run")
    parser.add_argument("--chunks", type=int, default=5, help="scored chunks of --chunk batches (+1 for the first reference)")
    parser.add_argument("--chunk", type=int, default=16, help="L (<= 20, exact solver); halves are scored too")
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per batch")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=1024, help="BPE vocabulary trained on the sample")
    parser.add_argument("--k", type=int, default=16384, help="sjlt sketch size (with the control variate)")
    parser.add_argument("--gamma", type=float, default=1e-3, help="γ of the plain step (preconditioner none)")
    parser.add_argument("--sample-fractions", default="0.125,0.5,1.0")
    parser.add_argument("--estimators", default=",".join(ESTIMATORS),
                        help="comma list of the estimator families to score (default: all)")
    parser.add_argument(
        "--full-batch-estimators", default="first_order,fisher,gnb,hutchinson:1",
        help="estimators scored at sample fraction 1.0 (hutchinson:n = up to n probes): the rest is too slow on CPU",
    )
    parser.add_argument(
        "--param-filters", default=r"none,ln_f|h\.1\.mlp",
        help="'none' = all parameters; the others are scored at the smallest sample fraction only",
    )
    parser.add_argument(
        "--reference-dtype", default="float32", choices=("float32", "float64"),
        help="float32 orders like float64 under the AdamW step (tiny @1000: Spearman 1.00, regret 0.00)",
    )
    parser.add_argument("--cost-batches", type=int, default=3, help="batches per timed worker call")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0 = torch default)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where the influence workers and the timed training step run (cuda: the first GPU)")
    parser.add_argument(
        "--snapshot-dtype", action="store_true",
        help="instead of the estimator sweep: bfloat16 vs float32 weights snapshots of the same weights, "
             "bytes and S fidelity with the default config (influence_snapshot.py)",
    )


def run(args: argparse.Namespace) -> int:
    """Run the benchmark, print the tables, write JSON."""
    import torch

    if args.quick:
        args.models, args.train_steps, args.chunks, args.chunk = "tiny", "20", 2, 4
        args.sample_fractions, args.param_filters, args.k, args.cost_batches = "0.5", "none", 64, 1
        args.full_batch_estimators = ""
    if args.chunk > 20:
        raise ValueError(f"--chunk must be <= 20 (exact solver), got {args.chunk}")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        from d3ray.errors import UserError

        raise UserError("--device cuda: torch sees no CUDA device here (torch.cuda.is_available() is False); "
                        "use --device cpu")
    steps = [int(s) for s in args.train_steps.split(",") if s]
    corpus = load_corpus(args.data, args.workdir, args.vocab, args.seq_len, per_domain=2000)
    records: list[dict[str, Any]] = []
    for model in [m for m in args.models.split(",") if m]:
        cfg_dict = model_config(model, corpus, args.seq_len)
        snaps = trained_weights(
            model, steps, corpus, cfg_dict, args.batch_size, args.schedule_steps, args.workdir
        )
        for s in steps:
            if args.snapshot_dtype:
                records.append(bench_snapshot_dtype(model, cfg_dict, snaps[s], corpus, args))
            else:
                records += bench_weights(model, cfg_dict, snaps[s], corpus, args, with_cost=s == max(steps))
    if args.snapshot_dtype:
        print_snapshot_table(records)
    else:
        attach_costs(records, args.chunk)
        print_table(records, args.chunk)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"args": _jsonable(vars(args)), "records": records}, indent=1))
        print(f"wrote {args.out}")
    return 0


def bench_weights(model: str, cfg_dict: dict, snap, corpus, args, with_cost: bool) -> list[dict[str, Any]]:
    """Records of one (model, training steps): the reference, then every variant per fraction/filter."""
    from d3ray.influence.config import InfluenceConfig, SjltSketchConfig
    from d3ray.influence.estimators import LookaheadConfig
    from d3ray.influence.worker import InfluenceWorker

    L = args.chunk
    rng = np.random.default_rng(2024 + snap.steps)
    chunks = [mixed_batches(corpus.heldout, L, args.batch_size, rng) for _ in range(args.chunks + 1)]
    ids = list(range(L))
    parts = [snap.weights, snap.optimizer]
    tag = f"[{model} @{snap.steps}]"

    t0 = time.perf_counter()
    ref_cfg = InfluenceConfig(  # whole batches: every sequence (the default samples an eighth of them)
        estimator=LookaheadConfig(), preconditioner="adam", sample_fraction=1.0, dtype=args.reference_dtype,
        device=args.device,
    )
    look = InfluenceWorker(cfg_dict, ref_cfg)
    S_ref = [None] + [
        ref_cfg.estimator.merge([look.lookahead_matrix(parts, chunks[c], ids)], ids)[1]
        for c in range(1, args.chunks + 1)
    ]
    print(f"{tag} reference look-ahead: {time.perf_counter() - t0:.0f}s for {args.chunks} chunks", flush=True)
    records = [fidelity_record(model, snap, "lookahead", "adam", 1.0, "none", merge_scores(
        [chunk_scores(S_ref[c], S_ref[c], L) for c in range(1, args.chunks + 1)]), {})]
    del look

    fractions = [float(f) for f in args.sample_fractions.split(",") if f]
    filters = [None if f == "none" else f for f in args.param_filters.split(",") if f]
    for frac in fractions:
        for pfilter in filters:
            if pfilter is not None and frac != min(fractions):
                continue
            todo = variants(frac, args.full_batch_estimators, estimator_families(args.estimators))
            if not todo:
                continue
            base = InfluenceConfig(
                sketch=SjltSketchConfig(k=args.k), gamma=args.gamma, sample_fraction=frac,
                param_filter=pfilter, dtype="float32", device=args.device,
            )
            t0 = time.perf_counter()
            records += score_variants(model, cfg_dict, snap, parts, chunks, S_ref, base, todo, args)
            print(f"{tag} fraction {frac} filter {pfilter}: {time.perf_counter() - t0:.0f}s", flush=True)
            if with_cost:
                cost_variants(records, model, cfg_dict, parts, chunks[0][: args.cost_batches], base, todo, args)
    return records


def print_table(records: list[dict[str, Any]], L: int) -> None:
    """One markdown row per record (the README table); medians over the chunks."""
    fmt = lambda v, p=2: "-" if v is None else f"{v:.{p}f}"  # noqa: E731
    h = L // 2
    print(f"| model | steps | variant | precond | frac | filter | cost | rho L{L} | regret L{L} | regret L{h} "
          f"| sketch regret L{L} |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in records:
        print(
            f"| {r['model']} | {r['steps']} | {r['variant']} | {r['preconditioner']} | {r['sample_fraction']} | "
            f"{r['param_filter']} | {fmt(r.get('cost_ratio'))} | {fmt(r.get(f'spearman_L{L}'))} | "
            f"{fmt(r.get(f'regret_L{L}'))} | {fmt(r.get(f'regret_L{h}'))} | {fmt(r.get(f'sketch_regret_L{L}'))} |",
            flush=True,
        )


def _jsonable(d: dict) -> dict:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in d.items() if k != "func"}
