"""``d3ray bench influence``: cost and fidelity of the influence estimators and sketches.

For a tiny and a small GPT-2 (built from configs, briefly trained on byte-level RedPajama text so that
θ is not the initialisation), on chunks of L <= 9 batches, side by side in one process:

- cost per batch of each estimator as a ratio to one training step (forward + backward + AdamW step)
  timed in the same process; sketch time; peak memory (CUDA allocator peak, or the RSS growth on CPU);
- fidelity of S's off-diagonal entries: Spearman, and the normalised order regret

      regret = (cost_ref(σ_est) − cost_ref(σ_ref)) / (E_random cost_ref(σ) − cost_ref(σ_ref))

  (0 = as good as ordering with the reference, 1 = no better than a random order; the random mean is
  exact: each pair is violated with probability 1/2), with σ from the exact solver
  (:func:`d3ray.solver.exact.solve_exact`). Two references: the full-dimension Taylor S of the same
  estimator (sketch fidelity: ``spearman``, ``regret``), and the exact ``lookahead`` S
  (estimator fidelity: ``spearman_lookahead``, ``regret_lookahead``).

Fidelity is measured in float64 (the look-ahead is a difference of losses); the costs in float32.
The full-dimension statistics of each chunk are computed once and then sketched for every k and seed
with the same code the worker uses (``SketchConfig.build`` and ``ControlVariate``), whose reference is
the mean of a previous chunk at the same weights, as in the pipeline.
"""

from __future__ import annotations

import argparse
import json
import logging
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

MODELS = {
    "tiny": {"n_layer": 2, "n_embd": 64, "n_head": 2},
    "small": {"n_layer": 4, "n_embd": 128, "n_head": 4},
}
TAYLOR_ESTIMATORS = ("first_order", "fisher", "gnb", "hutchinson")
DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "redpajama_sample" / "redpajama_1t"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``d3ray bench influence``."""
    parser.add_argument("--out", type=Path, help="write the records as JSON here")
    parser.add_argument(
        "--quick", action="store_true", help="tiny model, 3 seeds, k in {256, 3500}: a smoke run"
    )
    parser.add_argument("--models", default="tiny,small", help="comma list of: " + ", ".join(MODELS))
    parser.add_argument(
        "--estimators",
        default=",".join((*TAYLOR_ESTIMATORS, "lookahead", "taylor_hessian")),
        help="taylor_hessian (bench only) = exact-Hessian second-order Taylor, L² Hessian-vector products",
    )
    parser.add_argument("--cost-batches", type=int, default=4, help="batches per timed worker call")
    parser.add_argument("--ks", default="256,1024,3500", help="sketch sizes (sjlt, the default sketch)")
    parser.add_argument("--seeds", type=int, default=5, help="chunks (and sketch seeds) per model")
    parser.add_argument(
        "--chunk", type=int, default=8, help="L, batches per chunk (<= 9 for the exact solver)"
    )
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per batch")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--gamma", type=float, default=0.01, help="look-ahead step γ")
    parser.add_argument("--probes", type=int, default=1, help="Hutchinson probes / GNB samples")
    parser.add_argument("--train-steps", type=int, default=100, help="AdamW steps before measuring")
    parser.add_argument(
        "--batch-domains",
        choices=("mixed", "single"),
        default="mixed",
        help="each batch mixes domains (like pre-training) or holds one domain",
    )
    parser.add_argument("--save-s", type=Path, help="save S matrices (.npy) for the solver benchmark")
    parser.add_argument("--device", default="cpu", help="device of the timed runs: cpu, cuda, auto")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0 = torch default)")


def run(args: argparse.Namespace) -> int:
    """Run the benchmark, print the table, write JSON."""
    import torch

    if args.quick:
        args.models, args.seeds, args.ks, args.train_steps, args.chunk = "tiny", 3, "256,3500", 30, 6
        args.estimators, args.cost_batches = "fisher,hutchinson,lookahead", 2
    models = [m for m in args.models.split(",") if m]
    estimators = [e for e in args.estimators.split(",") if e]
    ks = [int(k) for k in args.ks.split(",") if k]
    if args.chunk > 9:
        raise ValueError(f"--chunk must be <= 9 (exact solver), got {args.chunk}")
    if args.threads:
        torch.set_num_threads(args.threads)
    corpus = _corpus()
    records: list[dict[str, Any]] = []
    for model in models:
        records += _bench_model(model, args, estimators, ks, corpus)
    _print_table(records)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"args": _jsonable(vars(args)), "records": records}, indent=1))
        print(f"wrote {args.out}")
    return 0


# ---- data and model --------------------------------------------------------------------------------
def _corpus() -> list[np.ndarray]:
    """Per-domain byte-level token streams of the RedPajama sample (vocab 256), or synthetic text."""
    streams = []
    if DATA.is_dir():
        for domain in sorted(p for p in DATA.iterdir() if p.is_dir()):
            buf = bytearray()
            for f in sorted(domain.glob("*.jsonl")):
                with open(f, encoding="utf-8") as fh:
                    for line in fh:
                        buf += json.loads(line)["text"].encode("utf-8")
                        if len(buf) > 500_000:
                            break
            if len(buf) > 10_000:
                streams.append(np.frombuffer(bytes(buf), dtype=np.uint8).astype(np.int64))
    if not streams:
        logger.warning("bench influence: %s not found; using synthetic Markov text", DATA)
        rng = np.random.default_rng(0)
        for d in range(4):
            trans = rng.dirichlet(np.full(256, 0.05), size=256)
            seq = [d]
            for _ in range(200_000):
                seq.append(rng.choice(256, p=trans[seq[-1]]))
            streams.append(np.array(seq, dtype=np.int64))
    return streams


def _batches(rng: np.random.Generator, corpus: list[np.ndarray], n: int, b: int, T: int, mode: str):
    out = []
    for _ in range(n):
        domains = [rng.integers(len(corpus))] * b if mode == "single" else rng.integers(len(corpus), size=b)
        rows = [corpus[d][s : s + T] for d in domains for s in [rng.integers(0, len(corpus[d]) - T)]]
        out.append(np.stack(rows))
    return out


def _model_config(name: str, T: int) -> dict:
    import transformers

    # Byte-level ids (< 256) in a 512 vocabulary: GPT-2's default bos/eos id 50256 would lie outside it.
    return transformers.GPT2Config(
        vocab_size=512, n_positions=T, bos_token_id=0, eos_token_id=0, **MODELS[name]
    ).to_dict()


def _train(model_config: dict, corpus, args) -> tuple[dict[str, np.ndarray], float]:
    """Brief AdamW training; returns (weights snapshot, seconds of one training step, min of the last 20)."""
    import torch

    from d3ray.influence.worker import build_causal_lm

    torch.manual_seed(0)
    model = build_causal_lm(model_config).train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    rng = np.random.default_rng(12345)
    times = []
    for _ in range(args.train_steps + 5):
        x = torch.from_numpy(_batches(rng, corpus, 1, args.batch_size, args.seq_len, "mixed")[0])
        t0 = time.perf_counter()
        loss = model(x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    logger.info("trained %d steps, loss %.3f", len(times), float(loss.detach()))
    weights = {k: v.detach().float().cpu().numpy() for k, v in model.state_dict().items()}
    return weights, float(np.min(times[-min(20, len(times)) :]))  # least disturbed, as for the influence runs


# ---- fidelity ---------------------------------------------------------------------------------------
def _offdiag(S: np.ndarray) -> np.ndarray:
    return S[~np.eye(S.shape[0], dtype=bool)]


def _fidelity(S_est: np.ndarray, S_ref: np.ndarray) -> tuple[float | None, float | None]:
    """(Spearman of off-diagonal entries, normalised regret of the exact order of S_est under S_ref)."""
    from scipy.stats import spearmanr

    from d3ray.solver.exact import solve_exact
    from d3ray.solver.problem import ordering_cost

    rho = None
    if np.ptp(_offdiag(S_est)) > 0 and np.ptp(_offdiag(S_ref)) > 0:
        rho = float(spearmanr(_offdiag(S_est), _offdiag(S_ref))[0])
    best_order, best = solve_exact(S_ref)
    random_mean = 0.5 * float(np.maximum(S_ref, 0).sum())
    if random_mean - best <= 0:
        return rho, None
    # An all-zero S (first_order) carries no preference: the order falls back to the initial one.
    order = np.arange(S_est.shape[0]) if not np.any(S_est) else solve_exact(S_est)[0]
    return rho, (ordering_cost(S_ref, order) - best) / (random_mean - best)


def _unflatten(rows: np.ndarray, shapes: dict[str, tuple], torch_mod) -> dict:
    out, at = {}, 0
    t = torch_mod.from_numpy(rows)
    for name, shape in shapes.items():
        size = int(np.prod(shape))
        out[name] = t[:, at : at + size].reshape(rows.shape[0], *shape)
        at += size
    return out


def _sketched_S(full, reference, shapes, sketch_cfg, control_variate: bool, gamma: float) -> np.ndarray:
    """S of full-dimension rows {q, h: (L, d)} after sketching, optionally with the control variate."""
    import torch

    from d3ray.influence.control_variate import ControlVariate
    from d3ray.influence.influence import influence_matrices

    sketch = sketch_cfg.build()
    named = {s: _unflatten(full[s], shapes, torch) for s in ("q", "h")}
    rows = {s: sketch.project(named[s]) for s in ("q", "h")}
    if control_variate:
        cv = ControlVariate(reference, sketch, torch.device("cpu"), torch.float64)
        rows = cv.augment({s: named[s] for s in ("q", "h")}, rows)
    zeros = np.zeros_like(rows["q"].numpy())
    return influence_matrices(zeros, rows["q"].numpy(), rows["h"].numpy(), gamma)[1]


# ---- cost -------------------------------------------------------------------------------------------
class _PeakMemory:
    """Peak memory growth during a block: CUDA allocator peak, or sampled process RSS on CPU."""

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")
        self.peak_mb = 0.0

    def _rss(self) -> float:
        with open("/proc/self/statm") as fh:
            import os

            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    def __enter__(self):
        import torch

        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated() / 2**20
        else:
            self.base = self._rss()
            self.stop = threading.Event()
            self.high = self.base
            self.thread = threading.Thread(target=self._sample, daemon=True)
            self.thread.start()
        return self

    def _sample(self) -> None:
        while not self.stop.wait(0.005):
            self.high = max(self.high, self._rss())

    def __exit__(self, *exc) -> None:
        import torch

        if self.cuda:
            self.peak_mb = torch.cuda.max_memory_allocated() / 2**20 - self.base
        else:
            self.stop.set()
            self.thread.join()
            self.peak_mb = max(self.high, self._rss()) - self.base


def _cost(model_config, weights, batches, config, device: str, threads: int) -> tuple[float, float, float]:
    """(seconds per batch, sketch seconds per batch, peak MB) of one float32 worker call.

    Runs in a fresh spawned process, so that the memory peak is not hidden by memory the allocator
    kept from earlier work (on CPU it is the RSS growth during the first call, sampled every 5 ms);
    the time is the faster of two further calls.
    """
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_cost_in_process, model_config, weights, batches, config, device, threads).result()


def _cost_in_process(model_config, weights, batches, config, device: str, threads: int):
    import torch

    from d3ray.influence.worker import InfluenceWorker

    if threads:
        torch.set_num_threads(threads)
    worker = InfluenceWorker(model_config, replace(config, dtype="float32", device=device))
    ids = list(range(len(batches)))

    def call() -> tuple[float, float]:
        t0 = time.perf_counter()
        if config.estimator == "lookahead":
            worker.lookahead_matrix(weights, batches, ids)
            sketch = 0.0
        else:
            sketch = worker.sketch_batches(weights, batches, ids).timings["influence/sketch_sec"]
        return time.perf_counter() - t0, sketch

    worker.load_weights(weights)
    # The first call's memory growth counts what the worker keeps (the sketch's row cache) and its
    # transient peak; later calls would reuse memory the allocator kept and show no growth.
    with _PeakMemory(device) as mem:
        call()
    total, sketch_sec = min(call() for _ in range(2))  # the least disturbed run on a shared machine
    return total / len(batches), sketch_sec / len(batches), mem.peak_mb


# ---- driver -----------------------------------------------------------------------------------------
def _bench_model(model: str, args, estimators, ks, corpus) -> list[dict[str, Any]]:
    """Records of one model: per Taylor estimator the full-dimension row and one row per (k, cv)."""
    import torch

    from d3ray.influence.config import IdentitySketchConfig, InfluenceConfig, SjltSketchConfig
    from d3ray.influence.control_variate import Reference
    from d3ray.influence.influence import influence_from_lookahead, influence_matrices
    from d3ray.influence.statistics import taylor_influence
    from d3ray.influence.worker import InfluenceWorker

    T, L = args.seq_len, args.chunk
    model_config = _model_config(model, T)
    weights, step_sec = _train(model_config, corpus, args)
    print(f"[{model}] training step {step_sec * 1e3:.1f} ms (b={args.batch_size}, T={T})", flush=True)
    rng = np.random.default_rng(2024)
    # Chunk 0 only provides the first control-variate reference (the "previous chunk").
    chunks = [_batches(rng, corpus, L, args.batch_size, T, args.batch_domains) for _ in range(args.seeds + 1)]
    ids = list(range(L))
    base = InfluenceConfig(
        sketch=IdentitySketchConfig(),
        control_variate=False,
        dtype="float64",
        device="cpu",
        gamma=args.gamma,
        hutchinson_probes=args.probes,
        gnb_samples=args.probes,
    )
    look = InfluenceWorker(model_config, replace(base, estimator="lookahead"))
    S_look = [None] + [
        influence_from_lookahead([look.lookahead_matrix(weights, chunks[c], ids)], ids)[1]
        for c in range(1, args.seeds + 1)
    ]
    cost_batches = chunks[0][: args.cost_batches]
    records = []
    if "taylor_hessian" in estimators:
        fid = []
        for c in range(1, args.seeds + 1):
            objectives = [look._objective(b, i) for b, i in zip(chunks[c], ids, strict=True)]
            A = taylor_influence(objectives, look._leaves(), args.gamma).detach().numpy()
            fid.append(_fidelity(A.T - A, S_look[c]))
        records.append(
            _record(model, "taylor_hessian", None, "identity", False, {"lookahead": fid}, None, step_sec)
        )
    for est in [e for e in estimators if e in TAYLOR_ESTIMATORS]:
        worker = InfluenceWorker(model_config, replace(base, estimator=est))
        named = dict(worker.model.named_parameters())
        shapes = {n: tuple(named[n].shape) for n in worker.names}
        variants = [(k, cv) for k in ks for cv in ((True, False) if est == "hutchinson" else (True,))]
        fid: dict[tuple, dict[str, list]] = {v: {"sketch": [], "lookahead": []} for v in variants}
        full_fid, reference = [], None
        for c in range(args.seeds + 1):
            bs = worker.sketch_batches(weights, chunks[c], ids)
            rows = {"q": bs.Q, "h": bs.H}
            if c >= 1:
                S_full = influence_matrices(bs.G, bs.Q, bs.H, args.gamma)[1]
                full_fid.append(_fidelity(S_full, S_look[c]))
                for k, cv in variants:
                    S = _sketched_S(rows, reference, shapes, SjltSketchConfig(k=k, seed=c), cv, args.gamma)
                    fid[(k, cv)]["sketch"].append(_fidelity(S, S_full))
                    fid[(k, cv)]["lookahead"].append(_fidelity(S, S_look[c]))
                    if args.save_s and est == "hutchinson" and cv and k == max(ks):
                        _save(args.save_s, f"{model}_chunk{c}", S_full, S, S_look[c])
            reference = Reference(vectors={s: _named_mean(rows[s], shapes) for s in rows}, count=L)
        del bs, rows
        cost = _cost(
            model_config, weights, cost_batches, replace(base, estimator=est), args.device, args.threads
        )
        records.append(_record(model, est, None, "identity", False, {"lookahead": full_fid}, cost, step_sec))
        for k, cv in variants:
            cfg = replace(base, estimator=est, sketch=SjltSketchConfig(k=k), control_variate=cv)
            cost = _cost(model_config, weights, cost_batches, cfg, args.device, args.threads)
            records.append(_record(model, est, k, "sjlt", cv, fid[(k, cv)], cost, step_sec))
        print(f"[{model}] {est} done", flush=True)
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    if "lookahead" in estimators:
        cost = _cost(
            model_config, weights, chunks[1], replace(base, estimator="lookahead"), args.device, args.threads
        )
        records.append(_record(model, "lookahead", None, "none", False, {}, cost, step_sec))
    return records


def _named_mean(rows: np.ndarray, shapes: dict[str, tuple]) -> dict[str, np.ndarray]:
    mean, out, at = rows.mean(axis=0), {}, 0
    for name, shape in shapes.items():
        size = int(np.prod(shape))
        out[name] = mean[at : at + size].reshape(shape)
        at += size
    return out


def _save(directory: Path, stem: str, S_full, S_sketch, S_look) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    np.save(directory / f"{stem}_hutchinson_full.npy", S_full)
    np.save(directory / f"{stem}_hutchinson_sjlt.npy", S_sketch)
    np.save(directory / f"{stem}_lookahead.npy", S_look)


def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return float(np.median(values)) if values else None


def _record(model, est, k, sketch, cv, fidelity, cost, step_sec) -> dict[str, Any]:
    sk = fidelity.get("sketch", [])
    lk = fidelity.get("lookahead", fidelity.get("full", []))
    rec = {
        "model": model,
        "estimator": est,
        "k": k,
        "sketch": sketch,
        "control_variate": cv,
        "spearman": _median(r for r, _ in sk),
        "regret": _median(g for _, g in sk),
        "regret_per_seed": [g for _, g in sk],
        "spearman_lookahead": _median(r for r, _ in lk),
        "regret_lookahead": _median(g for _, g in lk),
        "cost_ratio": None,
        "sec_per_batch": None,
        "sketch_ms_per_batch": None,
        "peak_mem_mb": None,
    }
    if cost is not None:
        per_batch, sketch_sec, peak = cost
        rec.update(
            cost_ratio=per_batch / step_sec,
            sec_per_batch=per_batch,
            sketch_ms_per_batch=sketch_sec * 1e3,
            peak_mem_mb=peak,
        )
    return rec


def _print_table(records: list[dict[str, Any]]) -> None:
    fmt = lambda v, p=3: "-" if v is None else (f"{v:.{p}f}" if isinstance(v, float) else str(v))  # noqa: E731
    head = (
        "model",
        "estimator",
        "k",
        "cv",
        "cost_ratio",
        "sketch_ms",
        "peak_mb",
        "spearman",
        "regret",
        "rho_look",
        "regret_look",
    )
    print(" | ".join(f"{h:>11}" for h in head))
    for r in records:
        cells = (
            r["model"],
            r["estimator"],
            r["k"] if r["k"] else r["sketch"],
            "y" if r["control_variate"] else "n",
            fmt(r["cost_ratio"], 2),
            fmt(r["sketch_ms_per_batch"], 1),
            fmt(r["peak_mem_mb"], 0),
            fmt(r["spearman"]),
            fmt(r["regret"]),
            fmt(r["spearman_lookahead"]),
            fmt(r["regret_lookahead"]),
        )
        print(" | ".join(f"{c!s:>11}" for c in cells))


def _jsonable(d: dict) -> dict:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in d.items() if k != "func"}
