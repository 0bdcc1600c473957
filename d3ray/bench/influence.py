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
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from d3ray.bench.influence_fidelity import fidelity, median
from d3ray.bench.influence_setup import (
    DEFAULT_DATA,
    load_corpus,
    mixed_batches,
    model_config,
    trained_weights,
)
from d3ray.bench.influence_snapshot import bench_snapshot_dtype, print_snapshot_table

logger = logging.getLogger(__name__)

ESTIMATORS = ("first_order", "drift", "drift_only", "fisher", "gnb", "hutchinson")
#: drift (potential.py): the exact AdamW drift potential + the sketched residual (``residual: sketch``);
#: drift_only: the potential alone (``residual: none``, the default estimator). Both need the AdamW step:
#: scored with preconditioner adam only.
ADAM_ONLY = ("drift", "drift_only")
PROBES = (1, 2, 4, 8)


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
        _attach_costs(records, args.chunk)
        print_table(records, args.chunk)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"args": _jsonable(vars(args)), "records": records}, indent=1))
        print(f"wrote {args.out}")
    return 0


# ---- variants ---------------------------------------------------------------------------------------
def variants(sample_fraction: float, full_batch: str, estimators: tuple[str, ...] = ESTIMATORS) -> list[tuple[str, int]]:
    """(estimator, probes) pairs scored at this sample fraction; probes 0 = not hutchinson.

    Hutchinson runs up to fraction · probes <= 1 (8 probes at 1/8 of the batch, 2 at half of it): more
    costs several training steps per batch, off the frontier of interest (<= 1x) and slow on a CPU.
    """
    out = [(e, 0) for e in estimators if e != "hutchinson"]
    if "hutchinson" in estimators:
        out += [("hutchinson", n) for n in PROBES if sample_fraction * n <= 1.0 or n == 1]
    if sample_fraction < 1.0:
        return out
    allowed = {}
    for item in (x for x in full_batch.split(",") if x):
        name, _, n = item.partition(":")
        allowed[name] = int(n) if n else max(PROBES)
    return [(e, n) for e, n in out if e in allowed and n <= allowed[e]]


def estimator_families(names: str) -> tuple[str, ...]:
    """``--estimators``: a comma list of known families, in the bench's order."""
    asked = [n for n in names.split(",") if n]
    unknown = sorted(set(asked) - set(ESTIMATORS))
    if unknown or not asked:
        raise ValueError(f"--estimators {names!r}: unknown {unknown}; known: {', '.join(ESTIMATORS)}")
    return tuple(e for e in ESTIMATORS if e in asked)


def _estimator_config(name: str, probes: int):
    from d3ray.influence.estimators import DriftConfig, EstimatorConfig, HutchinsonConfig

    if name in ADAM_ONLY:
        return DriftConfig(residual="none" if name == "drift_only" else "sketch")
    return HutchinsonConfig(probes=probes) if name == "hutchinson" else EstimatorConfig.lookup(name)()


def _preconditioners(name: str) -> tuple[str, ...]:
    return ("adam",) if name in ADAM_ONLY else ("none", "adam")


def _label(name: str, probes: int, shared: bool = False) -> str:
    base = f"hutchinson{probes}" if name == "hutchinson" else name
    return base + ("_shared" if shared else "")


# ---- fidelity ---------------------------------------------------------------------------------------
def _scores(S_est: np.ndarray, S_ref: np.ndarray, L: int) -> dict[int, list[tuple]]:
    """Fidelity on the whole chunk and on each of its halves: {L: [...], L/2: [...]}."""
    half = L // 2
    return {
        L: [fidelity(S_est, S_ref)],
        half: [fidelity(S_est[sl, sl], S_ref[sl, sl]) for sl in (slice(0, half), slice(half, L))],
    }


def full_dimension_S(stats: list, params: dict, config, optimizer) -> np.ndarray:
    """S of full-dimension statistics (no sketch), in float64: the sketch-free value of a variant."""
    import torch

    from d3ray.influence.chunk import batch_vectors

    first = next(iter(params.values()))
    moments = optimizer.tensors(params, first.device, first.dtype) if config.needs_optimizer_state else None
    vecs = [batch_vectors(st, params, config, optimizer, moments) for st in stats]
    eta = vecs[0][0]

    def gram(a: str, b: str) -> np.ndarray:
        flat_a = torch.stack([torch.cat([v[1][a][n].reshape(-1) for n in params]).double() for v in vecs])
        flat_b = torch.stack([torch.cat([v[1][b][n].reshape(-1) for n in params]).double() for v in vecs])
        return (flat_a @ flat_b.T).numpy()

    S = 0.5 * eta**2 * (gram("h", "q") - gram("q", "h")) if "h" in vecs[0][1] else np.zeros((len(vecs),) * 2)
    if "u" in vecs[0][1]:
        F = gram("u", "g")  # F[i, j] = ⟨u_i, g_j⟩
        S = S - eta * (F.T - F)
    return S


# ---- one weights snapshot ---------------------------------------------------------------------------
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
    ref_cfg = InfluenceConfig(
        estimator=LookaheadConfig(), preconditioner="adam", dtype=args.reference_dtype, device=args.device
    )
    look = InfluenceWorker(cfg_dict, ref_cfg)
    S_ref = [None] + [
        ref_cfg.estimator.merge([look.lookahead_matrix(parts, chunks[c], ids)], ids)[1]
        for c in range(1, args.chunks + 1)
    ]
    print(f"{tag} reference look-ahead: {time.perf_counter() - t0:.0f}s for {args.chunks} chunks", flush=True)
    records = [_record(model, snap, "lookahead", "adam", 1.0, "none", _merge_scores(
        [_scores(S_ref[c], S_ref[c], L) for c in range(1, args.chunks + 1)]), {})]
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
            records += _bench_variants(model, cfg_dict, snap, parts, chunks, S_ref, base, todo, args)
            print(f"{tag} fraction {frac} filter {pfilter}: {time.perf_counter() - t0:.0f}s", flush=True)
            if with_cost:
                _cost_variants(records, model, cfg_dict, parts, chunks[0][: args.cost_batches], base, todo, args)
    return records


def _bench_variants(model, cfg_dict, snap, parts, chunks, S_ref, base, todo, args) -> list[dict[str, Any]]:
    import torch

    from d3ray.influence.chunk import sketch_chunk
    from d3ray.influence.estimators import FirstOrderConfig, hutchinson_samples
    from d3ray.influence.estimators.gnb import mean_of
    from d3ray.influence.statistics import BatchStatistics, all_finite
    from d3ray.influence.worker import InfluenceWorker

    L, ids = args.chunk, list(range(args.chunk))
    worker = InfluenceWorker(cfg_dict, replace(base, estimator=FirstOrderConfig()))
    worker.load_weights(parts)
    sketch = base.sketch.build()
    families: dict[str, list[int]] = {}
    for est, n in todo:
        families.setdefault(est, []).append(n)
    scores: dict[tuple, list] = {}
    references: dict[tuple, Any] = {}
    for c in range(args.chunks + 1):
        params = worker.leaves()
        for est, probe_list in families.items():
            # statistics of each batch once per family; hutchinson: prefix means of 8 probes
            per_variant: dict[int, list] = {n: [] for n in probe_list}
            for b, bid in zip(chunks[c], ids, strict=True):
                obj, gen = worker.objective(b, bid), worker.generator(bid)
                if est == "hutchinson":
                    loss, g, draws = hutchinson_samples(obj.loss, params, max(probe_list), gen)
                    for n in probe_list:
                        h = mean_of(draws[:n])
                        ok = bool(torch.isfinite(loss)) and all_finite(g) and all_finite(h)
                        per_variant[n].append(BatchStatistics(float(loss), g, h, ok))
                else:
                    per_variant[0].append(_estimator_config(est, 0).statistics(obj, params, gen))
            for n, stats in per_variant.items():
                shared_ok = est in ("fisher", "hutchinson") and n in (0, max(PROBES))
                kinds = [False, True] if shared_ok else [False]
                for shared in kinds:
                    st_list = _shared(stats) if shared else stats
                    for pre in _preconditioners(est):
                        key = (_label(est, n, shared), pre)
                        cfg = replace(base, estimator=_estimator_config(est, n), preconditioner=pre)
                        out = sketch_chunk(
                            st_list, ids, params, cfg, sketch, reference=references.get(key),
                            return_means=True, optimizer=snap.optimizer,
                        )
                        references[key] = out.means
                        if c == 0:
                            continue
                        S = cfg.estimator.merge([out], ids)[1]
                        S_full = full_dimension_S(st_list, params, cfg, snap.optimizer)
                        acc = scores.setdefault(key, {"look": [], "sketch": []})
                        acc["look"].append(_scores(S, S_ref[c], L))
                        acc["sketch"].append(_scores(S, S_full, L))
    return [
        _record(model, snap, label, pre, base.sample_fraction, base.param_filter or "none",
                _merge_scores(acc["look"]), _merge_scores(acc["sketch"]))
        for (label, pre), acc in scores.items()
    ]


def _shared(stats: list) -> list:
    """The same statistics with every batch's h replaced by the chunk mean of h (one estimate per chunk)."""
    from d3ray.influence.statistics import BatchStatistics

    finite = [st for st in stats if st.finite and st.hdiag is not None]
    mean = {n: sum(st.hdiag[n] for st in finite) / len(finite) for n in finite[0].hdiag}
    return [BatchStatistics(st.loss, st.grad, mean, st.finite) for st in stats]


def _merge_scores(per_chunk: list[dict[int, list[tuple]]]) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for chunk in per_chunk:
        for L, pairs in chunk.items():
            acc = out.setdefault(L, {"spearman": [], "regret": []})
            acc["spearman"] += [r for r, _ in pairs]
            acc["regret"] += [g for _, g in pairs]
    return out


def _record(model, snap, label, pre, frac, pfilter, look, sketch) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "model": model, "steps": snap.steps, "train_loss": snap.loss, "variant": label,
        "preconditioner": pre, "sample_fraction": frac, "param_filter": pfilter,
    }
    for L, acc in look.items():
        rec[f"spearman_L{L}"] = median(acc["spearman"])
        rec[f"regret_L{L}"] = median(acc["regret"])
        rec[f"regret_L{L}_all"] = acc["regret"]
    for L, acc in sketch.items():
        rec[f"sketch_regret_L{L}"] = median(acc["regret"])
    return rec


# ---- cost -------------------------------------------------------------------------------------------
def _cost_variants(records, model, cfg_dict, parts, batches, base, todo, args) -> None:
    """Seconds per batch of each (estimator, preconditioner) at this fraction/filter, over a training step."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    configs = {}
    for est, n in todo:
        for pre in _preconditioners(est):
            configs[(_label(est, n), pre)] = replace(base, estimator=_estimator_config(est, n), preconditioner=pre)
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        timed = pool.submit(_cost_in_process, cfg_dict, parts, batches, configs, args.threads, args.device).result()
    for rec in records:
        if rec["model"] != model or rec["sample_fraction"] != base.sample_fraction:
            continue
        if rec["param_filter"] != (base.param_filter or "none"):
            continue
        key = (rec["variant"].removesuffix("_shared"), rec["preconditioner"])
        if key in timed:
            rec["sec_per_batch"], rec["step_sec"] = timed[key]
            rec["cost_estimator"] = key[0]


def _cost_in_process(cfg_dict, parts, batches, configs, threads, device="cpu"):
    """In a fresh process: one training step's time, then each config's worker seconds per batch, both on
    ``device`` (on CUDA each timing ends after a device synchronise)."""
    import torch

    from d3ray.influence.worker import InfluenceWorker
    from d3ray.model import ModelConfig, build_model

    if threads:
        torch.set_num_threads(threads)
    net = build_model(cfg_dict, ModelConfig(attn_implementation="eager")).train()
    net.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in parts[0].items()}, strict=False)
    net.to(device)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4)

    def sync() -> None:
        if device != "cpu":
            torch.cuda.synchronize()

    steps = []
    for b in batches * 3:
        x = torch.from_numpy(b).to(device)
        sync()
        t0 = time.perf_counter()
        loss = net(input_ids=x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        sync()
        steps.append(time.perf_counter() - t0)
    step_sec = float(np.min(steps))  # the least disturbed, as for the worker calls on a shared machine
    out = {}
    ids = list(range(len(batches)))
    for key, config in configs.items():
        worker = InfluenceWorker(cfg_dict, config)
        worker.load_weights(parts)
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            worker.sketch_batches(parts, batches, ids)
            sync()
            times.append((time.perf_counter() - t0) / len(batches))
        out[key] = (float(min(times)), step_sec)
    return out


def _attach_costs(records: list[dict[str, Any]], L: int) -> None:
    """Cost ratios (timed on the last weights) onto every record; ``*_shared`` = g + h once per chunk."""
    timed = {
        (r["model"], r["sample_fraction"], r["param_filter"], r["cost_estimator"], r["preconditioner"]):
        (r["sec_per_batch"], r["step_sec"]) for r in records if "sec_per_batch" in r
    }
    for r in records:
        key = (r["model"], r["sample_fraction"], r["param_filter"], r["variant"].removesuffix("_shared"),
               r["preconditioner"])
        if key not in timed:
            r["cost_ratio"] = None
            continue
        sec, step = timed[key]
        if r["variant"].endswith("_shared"):
            first = timed.get(key[:3] + ("first_order", r["preconditioner"]))
            sec = first[0] + (sec - first[0]) / L if first else sec
        r["cost_ratio"] = sec / step
        r["sec_per_batch_all"] = sec


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
