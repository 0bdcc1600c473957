"""``d3ray bench influence --snapshot-dtype``: what a 16-bit weights snapshot saves and what it costs.

Every chunk, trainer rank 0 publishes the weights and the AdamW m, v for the influence actors
(d3ray/train/scheduling/snapshot.py), in ``schedule.placement.snapshot_dtype``. For each bench model and training step
count this section builds both snapshots of the SAME trained weights through the trainers' own
conversion (``ship_state``, ``ship_optimizer_state``) and reports:

- bytes: the payload of each (``snapshot_nbytes``, what the schedule log's ``snapshot_bytes``
  records) and its pickle (what ``ray.put`` serialises; numpy and torch headers included), as
  bfloat16 / float32 ratios;
- fidelity: S of each chunk from the default influence config (``InfluenceConfig()``: drift (first_order until 2026-12-02),
  preconditioner adam, sjlt k = 3500 + control variate, sample_fraction 1/8) at the bfloat16 snapshot
  against S at the float32 one: Spearman of the off-diagonal entries, relative Frobenius error, and
  the normalised regret of the exact order of S_bf16 under S_fp32 (0 = the same decisions);
- two yardsticks: the same numbers for a float32 S with another sketch seed (the sketch's own noise,
  which every run already accepts), and each snapshot's regret against the exact same-optimizer
  look-ahead (the bench's reference; whether bfloat16 moves the order further from the truth).
"""

from __future__ import annotations

import pickle
import time
from dataclasses import replace
from typing import Any

import numpy as np

from d3ray.lab.bench.influence_fidelity import fidelity, median
from d3ray.lab.bench.influence_setup import TrainedWeights, mixed_batches

DTYPES = ("float32", "bfloat16")


def snapshot_parts(snap: TrainedWeights, dtype: str) -> list[Any]:
    """The parts a trainer would publish at these weights, in ``dtype`` (the trainers' conversion)."""
    from d3ray.train.scheduling.snapshot import ship_optimizer_state, ship_state

    return [ship_state(snap.weights, dtype), ship_optimizer_state(snap.optimizer, dtype)]


def pickled_bytes(parts: list[Any]) -> int:
    """Bytes of the parts pickled with protocol 5 (as Ray serialises them, buffers in band)."""
    return sum(len(pickle.dumps(p, protocol=5)) for p in parts)


def _relative_error(S: np.ndarray, S_ref: np.ndarray) -> float | None:
    norm = float(np.linalg.norm(S_ref))
    return float(np.linalg.norm(S - S_ref)) / norm if norm > 0 else None


def _chunk_S(worker: Any, parts: list[Any], batches: list[np.ndarray], ids: list[int]) -> np.ndarray:
    return worker.config.estimator.merge([worker.sketch_batches(parts, batches, ids)], ids)[1]


def bench_snapshot_dtype(model: str, cfg_dict: dict, snap: TrainedWeights, corpus: Any, args: Any) -> dict[str, Any]:
    """One record: bytes and S fidelity of a bfloat16 vs a float32 snapshot of ``snap``."""
    from d3ray.influence.config import InfluenceConfig, SjltSketchConfig
    from d3ray.influence.estimators import LookaheadConfig
    from d3ray.influence.worker import InfluenceWorker
    from d3ray.train.scheduling.snapshot import snapshot_nbytes

    started = time.perf_counter()
    parts = {dtype: snapshot_parts(snap, dtype) for dtype in DTYPES}
    config = InfluenceConfig(device="cpu")  # the defaults a D3 run uses
    workers = {dtype: InfluenceWorker(cfg_dict, config) for dtype in DTYPES}
    other_seed = InfluenceWorker(cfg_dict, replace(config, sketch=SjltSketchConfig(seed=config.sketch.seed + 1)))
    look_cfg = InfluenceConfig(estimator=LookaheadConfig(), preconditioner="adam", dtype=args.reference_dtype,
                               device="cpu")
    look = InfluenceWorker(cfg_dict, look_cfg)
    L, ids = args.chunk, list(range(args.chunk))
    rng = np.random.default_rng(4048 + snap.steps)
    per_chunk: dict[str, list] = {k: [] for k in ("bf16", "seed", "look_fp32", "look_bf16", "rel_bf16", "rel_seed")}
    for _ in range(args.chunks):
        batches = mixed_batches(corpus.heldout, L, args.batch_size, rng)
        S = {dtype: _chunk_S(workers[dtype], parts[dtype], batches, ids) for dtype in DTYPES}
        S_seed = _chunk_S(other_seed, parts["float32"], batches, ids)
        S_look = look_cfg.estimator.merge([look.lookahead_matrix(parts["float32"], batches, ids)], ids)[1]
        per_chunk["bf16"].append(fidelity(S["bfloat16"], S["float32"]))
        per_chunk["seed"].append(fidelity(S_seed, S["float32"]))
        per_chunk["look_fp32"].append(fidelity(S["float32"], S_look))
        per_chunk["look_bf16"].append(fidelity(S["bfloat16"], S_look))
        per_chunk["rel_bf16"].append(_relative_error(S["bfloat16"], S["float32"]))
        per_chunk["rel_seed"].append(_relative_error(S_seed, S["float32"]))
    nbytes = {dtype: snapshot_nbytes(parts[dtype]) for dtype in DTYPES}
    pickled = {dtype: pickled_bytes(parts[dtype]) for dtype in DTYPES}
    rec = {
        "section": "snapshot_dtype", "model": model, "steps": snap.steps, "chunks": args.chunks, "L": L,
        "bytes_float32": nbytes["float32"], "bytes_bfloat16": nbytes["bfloat16"],
        "bytes_ratio": nbytes["bfloat16"] / nbytes["float32"],
        "pickled_float32": pickled["float32"], "pickled_bfloat16": pickled["bfloat16"],
        "pickled_ratio": pickled["bfloat16"] / pickled["float32"],
        "seconds": time.perf_counter() - started,
    }
    for key in ("bf16", "seed", "look_fp32", "look_bf16"):
        rec[f"spearman_{key}"] = median([rho for rho, _ in per_chunk[key]])
        rec[f"regret_{key}"] = median([regret for _, regret in per_chunk[key]])
        rec[f"regret_{key}_all"] = [regret for _, regret in per_chunk[key]]
    rec["rel_error_bf16"] = median(per_chunk["rel_bf16"])
    rec["rel_error_seed"] = median(per_chunk["rel_seed"])
    return rec


def print_snapshot_table(records: list[dict[str, Any]]) -> None:
    """One markdown row per (model, steps): byte ratios, then bf16-vs-fp32 fidelity beside the yardsticks."""
    fmt = lambda v, p=3: "-" if v is None else f"{v:.{p}f}"  # noqa: E731
    print("| model | steps | MiB fp32 | MiB bf16 | bytes bf16/fp32 | pickled bf16/fp32 | rho bf16 vs fp32 | "
          "rel err S | regret bf16 vs fp32 | rho other sketch seed | rel err | regret | "
          "regret vs look-ahead fp32 / bf16 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in records:
        print(
            f"| {r['model']} | {r['steps']} | {r['bytes_float32'] / 2**20:.2f} | {r['bytes_bfloat16'] / 2**20:.2f} | "
            f"{fmt(r['bytes_ratio'])} | {fmt(r['pickled_ratio'])} | {fmt(r['spearman_bf16'])} | "
            f"{fmt(r['rel_error_bf16'], 4)} | {fmt(r['regret_bf16'])} | {fmt(r['spearman_seed'])} | "
            f"{fmt(r['rel_error_seed'], 4)} | {fmt(r['regret_seed'])} | "
            f"{fmt(r['regret_look_fp32'])} / {fmt(r['regret_look_bf16'])} |",
            flush=True,
        )
