"""``d3ray bench solver``: every ordering solver side by side on the same instances, in one process.

    d3ray bench solver --out solver.json [--quick] [--sizes 20,60] [--influence-dir DIR]

Instance families (docs/design/method.md §8, issue 4):

- ``gaussian``: S = A − Aᵀ, A_ij ~ N(0, 1): no structure, the hardest case for every heuristic;
- ``planted``: S_ij = sign(rank_j − rank_i) + noise · (G − Gᵀ)/√2 for a hidden order, G ~ N(0, 1);
- ``influence``: S matrices written by the influence estimator (``.npy`` files, (K, K) or (N, K, K), in
  ``--influence-dir``); skipped, with the reason printed, when no directory is given.

For each instance every solver runs with its default config, plus three budgeted runs of the default
solver: ``ils@100ms`` (time_budget_s = 0.1, the issue's L = 60 target), ``ils@rsr`` (the wall time RSR
just took on the same instance: "never worse than RSR at RSR's time") and, at L > 200 where the
default round count would take minutes, ``ils@10s`` instead of ``ils``. The gap is relative to the exact
optimum (L <= 20) or to the best cost any run found, including a long reference run (larger L):
gap = (cost − best) / best, 0 = best known. Wall seconds are what the issue's targets are stated in;
CPU seconds are reported beside them because on a shared machine wall time includes waiting for a core.

Output: a table on stdout and JSON ``{"settings", "records", "targets"}`` with one record per
(family, L, solver): ``family, L, solver, seconds, gap`` (means) plus ``cpu_seconds, gap_max,
best_rate`` (fraction of instances at the best-known cost) and ``n``.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

FULL_SIZES = (20, 60, 200, 1000)
QUICK_SIZES = (20, 60, 200)
FULL_INSTANCES = {20: 10, 60: 20, 200: 5, 1000: 2}
QUICK_INSTANCES = {20: 3, 60: 5, 200: 2, 1000: 1}
# Long reference run (seconds of ILS, two seeds) for sizes without an exact optimum.
FULL_REFERENCE_S = {60: 3.0, 200: 10.0, 1000: 40.0}
QUICK_REFERENCE_S = {60: 1.0, 200: 3.0, 1000: 10.0}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``d3ray bench solver``."""
    parser.add_argument("--out", type=Path, default=None, help="write the JSON results here")
    parser.add_argument("--quick", action="store_true", help="few instances, L <= 200, short references")
    parser.add_argument("--sizes", default=None, help="comma-separated L values (default 20,60,200,1000)")
    parser.add_argument("--instances", type=int, default=None, help="instances per (family, L)")
    parser.add_argument("--families", default="gaussian,planted,influence", help="comma-separated families")
    parser.add_argument(
        "--influence-dir", type=Path, default=None, help="directory of influence S .npy files"
    )
    parser.add_argument("--noise", type=float, default=1.0, help="noise level of the planted family")
    parser.add_argument("--seed", type=int, default=0, help="seed of the instance generator and the solvers")


def gaussian_instance(K: int, rng: np.random.Generator) -> np.ndarray:
    """(K, K) S = A − Aᵀ with standard normal A."""
    A = rng.normal(size=(K, K))
    return A - A.T


def planted_instance(K: int, rng: np.random.Generator, noise: float) -> np.ndarray:
    """(K, K) hidden-order tournament (+1 forward, −1 backward) plus antisymmetric Gaussian noise."""
    rank = np.empty(K, dtype=np.int64)
    rank[rng.permutation(K)] = np.arange(K)
    G = rng.normal(size=(K, K))
    return np.sign(rank[None, :] - rank[:, None]) + noise * (G - G.T) / np.sqrt(2.0)


def influence_instances(directory: Path) -> list[np.ndarray]:
    """Every (K, K) matrix in the ``.npy`` files of ``directory`` ((N, K, K) stacks are split)."""
    out: list[np.ndarray] = []
    for path in sorted(directory.glob("*.npy")):
        arr = np.load(path, allow_pickle=False)
        if arr.ndim == 2:
            out.append(arr)
        elif arr.ndim == 3:
            out.extend(arr)
        else:
            raise ValueError(f"{path}: expected (K, K) or (N, K, K), got shape {arr.shape}")
    return out


def _lineup(K: int) -> list[tuple[str, Any]]:
    """(label, config) of the fixed-budget runs at size K (``ils@rsr`` is added per instance)."""
    from d3ray.solver import ExactConfig, GreedyInsertionConfig, IlsConfig, RowSumConfig, RsrConfig
    from d3ray.solver.exact import MAX_EXACT_K

    runs: list[tuple[str, Any]] = [
        ("row_sum", RowSumConfig()),
        ("greedy_insertion", GreedyInsertionConfig()),
        ("rsr", RsrConfig()),
    ]
    if K <= MAX_EXACT_K:
        runs.append(("exact", ExactConfig()))
    runs.append(
        ("ils" if K <= 200 else "ils@10s", IlsConfig() if K <= 200 else IlsConfig(time_budget_s=10.0))
    )
    runs.append(("ils@100ms", IlsConfig(time_budget_s=0.1, max_iters=None, patience=None)))
    return runs


def bench_instance(S: np.ndarray, seed: int, reference_s: float | None) -> dict[str, Any]:
    """Run the lineup on one S; returns {"best": cost, "runs": {label: (cost, wall s, cpu s)}}."""
    from d3ray.solver import IlsConfig

    K = S.shape[0]
    runs: dict[str, tuple[float, float, float]] = {}
    for label, config in _lineup(K):
        cpu0 = time.process_time()
        result = config.build().solve(S, seed=seed)
        runs[label] = (result.cost, result.seconds, time.process_time() - cpu0)
    rsr_s = runs["rsr"][1]
    cpu0 = time.process_time()
    at_rsr = IlsConfig(time_budget_s=rsr_s, max_iters=None, patience=None).build().solve(S, seed=seed)
    runs["ils@rsr"] = (at_rsr.cost, at_rsr.seconds, time.process_time() - cpu0)
    if "exact" in runs:
        best = runs["exact"][0]
    else:
        best = min(cost for cost, _, _ in runs.values())
        if reference_s:
            long_run = IlsConfig(time_budget_s=reference_s, max_iters=None, patience=None).build()
            best = min([best] + [long_run.solve(S, seed=1000 + s).cost for s in range(2)])
    return {"best": best, "runs": runs}


def _gap(cost: float, best: float, S: np.ndarray) -> float:
    """(cost − best) / best; relative to the total weight when best is 0 (an acyclic S)."""
    if best > 0:
        return (cost - best) / best
    total = 0.5 * float(np.abs(S).sum())
    return (cost - best) / total if total > 0 else 0.0


def run(args: argparse.Namespace) -> int:
    """Run the benchmark, print the table, write ``--out``."""
    sizes = (
        tuple(int(s) for s in args.sizes.split(","))
        if args.sizes
        else (QUICK_SIZES if args.quick else FULL_SIZES)
    )
    counts = QUICK_INSTANCES if args.quick else FULL_INSTANCES
    reference_s = QUICK_REFERENCE_S if args.quick else FULL_REFERENCE_S
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    unknown = sorted(set(families) - {"gaussian", "planted", "influence"})
    if unknown:
        raise SystemExit(
            f"d3ray bench solver: unknown families {unknown}; known: gaussian, planted, influence"
        )
    rng = np.random.default_rng(args.seed)

    problems: list[tuple[str, np.ndarray]] = []
    for family in families:
        if family == "influence":
            if args.influence_dir is None:
                print("influence family skipped: no --influence-dir given (S matrices from the estimator)")
                continue
            found = influence_instances(args.influence_dir)
            if not found:
                print(f"influence family skipped: no .npy files in {args.influence_dir}")
            problems.extend(("influence", S) for S in found)
            continue
        for K in sizes:
            n = args.instances or counts.get(K, 2)
            for _ in range(n):
                S = (
                    gaussian_instance(K, rng)
                    if family == "gaussian"
                    else planted_instance(K, rng, args.noise)
                )
                problems.append((family, S))

    per_key: dict[tuple[str, int, str], list[tuple[float, float, float, bool]]] = defaultdict(list)
    started = time.perf_counter()
    for i, (family, S) in enumerate(problems):
        K = S.shape[0]
        outcome = bench_instance(S, args.seed, reference_s.get(K, 3.0) if K > 20 else None)
        best = outcome["best"]
        for label, (cost, wall, cpu) in outcome["runs"].items():
            gap = _gap(cost, best, S)
            per_key[(family, K, label)].append((wall, cpu, gap, gap <= 1e-9))
        logger.info(
            "instance %d/%d (%s, L=%d) done at %.0fs",
            i + 1,
            len(problems),
            family,
            K,
            time.perf_counter() - started,
        )

    records = []
    for (family, K, label), rows in per_key.items():
        arr = np.array(rows, dtype=np.float64)
        records.append(
            {
                "family": family,
                "L": K,
                "solver": label,
                "seconds": float(arr[:, 0].mean()),
                "gap": float(arr[:, 2].mean()),
                "cpu_seconds": float(arr[:, 1].mean()),
                "gap_max": float(arr[:, 2].max()),
                "best_rate": float(arr[:, 3].mean()),
                "n": len(rows),
            }
        )
    records.sort(key=lambda r: (r["family"], r["L"], r["seconds"]))
    targets = _targets(per_key)
    _print_table(records, targets)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        settings = {
            "quick": bool(args.quick),
            "sizes": list(sizes),
            "families": families,
            "noise": args.noise,
            "seed": args.seed,
            "reference_s": {str(k): v for k, v in reference_s.items()},
        }
        args.out.write_text(
            json.dumps({"settings": settings, "records": records, "targets": targets}, indent=1)
        )
        print(f"wrote {args.out}")
    return 0


def _targets(
    per_key: dict[tuple[str, int, str], list[tuple[float, float, float, bool]]],
) -> list[dict[str, Any]]:
    """The issue's two targets per (family, L): best-known within 100 ms at L = 60; ILS at RSR's time <= RSR."""
    out = []
    for family, K in sorted({(f, k) for f, k, _ in per_key}):
        at_rsr = per_key[(family, K, "ils@rsr")]
        rsr = per_key[(family, K, "rsr")]
        worse = sum(a[2] > r[2] + 1e-12 for a, r in zip(at_rsr, rsr, strict=True))
        row: dict[str, Any] = {
            "family": family,
            "L": K,
            "ils_at_rsr_worse_than_rsr": int(worse),
            "n": len(rsr),
        }
        if K == 60:
            fast = per_key[(family, K, "ils@100ms")]
            rate = float(np.mean([hit for _, _, _, hit in fast]))
            row["best_within_100ms_rate"] = rate
            row["best_within_100ms_met"] = rate >= 0.95
        out.append(row)
    return out


def _print_table(records: list[dict[str, Any]], targets: list[dict[str, Any]]) -> None:
    print(
        f"{'family':<10} {'L':>5} {'solver':<17} {'n':>3} {'wall_s':>9} {'cpu_s':>9} {'gap':>9} {'gap_max':>9} {'best%':>6}"
    )
    for r in records:
        print(
            f"{r['family']:<10} {r['L']:>5} {r['solver']:<17} {r['n']:>3} {r['seconds']:>9.4f} "
            f"{r['cpu_seconds']:>9.4f} {r['gap']:>9.5f} {r['gap_max']:>9.5f} {100 * r['best_rate']:>5.0f}%"
        )
    for t in targets:
        line = f"target {t['family']} L={t['L']}: ils@rsr worse than rsr on {t['ils_at_rsr_worse_than_rsr']}/{t['n']}"
        if "best_within_100ms_rate" in t:
            line += f"; best-known within 100 ms on {100 * t['best_within_100ms_rate']:.0f}% (target 95%)"
        print(line)
