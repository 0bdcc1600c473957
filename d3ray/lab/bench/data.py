"""``d3ray bench data``: the data stream's tokens/s against a plain single-process loop, side by side.

Both read the same shards, started from this process one after the other, and each figure is the
median over ``--reps`` alternating passes (the box is shared; alternating spreads its noise):

    plain loop   read → decompress → parse (iter_documents) → the same tokenizer's encode_batch_fast
                 (ids as int32 arrays), one process on one core (TOKENIZERS_PARALLELISM=false). It runs
                 as one Ray task so that it has the OS priority of the stream's tasks (Ray runs its
                 workers at niceness 15; on a busy box a plain loop in the driver would get more CPU)
    stream       ChunkStream over CorpusSource: Ray Data read + tokenize (1 and N tokenizers) → block
                 packer → batches of B → chunks of L, one epoch; tokens = real (non-padding) tokens
    mixed        the same, drawing every sequence by domain at the corpus' natural token mixture (so
                 no domain cycles much more than the plain stream), through the shared reader
                 (d3ray.data.domain_lanes; 1 and N tokenizers)
                 (reported: the sequences its queues hold at the end, read but not drawn yet, and
                 the domains that moved to lanes of their own)
    lanes_1      mixed with a lane per domain (``data.mix_shared_span_blocks=0``, 1 tokenizer task each): what
                 the shared reader saves

    stream_ratio           stream tokens/s ÷ plain-loop tokens/s            (target >= 0.9, 1 tokenizer);
                           a stream's tokens/s are those of its first ``WINDOW`` (70%) of the epoch's
                           chunks, before the next epoch's reader is pre-started: that reader reads
                           ahead on the same cores, which a plain pass would charge to the end of
                           epoch 0 and a mixed one (whose domains roll over) would not; the whole
                           pass is ``pass_tokens_per_sec``, the boundary ``epoch gap`` below.
                           ``steady``: from 20% of the chunks to 70%, without the stream's start-up
                           (its first chunk, and for a mixed stream the filling of its queues)
    mixed_cost             1 − mixed tokens/s ÷ stream tokens/s             (target < 0.05)
    tokens per CPU-second  the same ratios in CPU time (this process and the Ray processes under it,
                           sampled with psutil): what the wall clock means on a box shared with others
    warm-up                one untimed short pass first: a fresh Ray instance's first stream also starts
                           the worker processes that every later pass reuses (``ray_cold_start_sec``)
    resume seconds         time to the first chunk of a stream started at the cursor of a chunk at
                           10/50/90% of the epoch, against the fresh start (flat = seeking works), and
                           what re-reading to that chunk costs (the plain pass's time to reach it)
    epoch boundary         gap between the last chunk of epoch 0 and the first of epoch 1 (pre-started)
                           against the mean gap between chunks and a cold start

Corpus: ``--copies`` copies of the shared SlimPajama-format train shard (default 8, 17.6M tokens), or
``--data PATH``; ``--quick`` generates a small sample corpus instead (a smoke test of the benchmark).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

WINDOW = 0.7  # the share of the epoch's chunks a stream's tokens/s are measured over (see above)
STEADY_FROM = 0.2  # the steady rate: from this share of the chunks to WINDOW
SHARED_SHARD = Path("../shared/data/redpajama_sample/slimpajama_format/train/chunk1/example_train_0.jsonl.zst")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--work-dir", default="runs/bench_data", help="corpus copies and tokenizer go here")
    parser.add_argument("--data", default=None, help="shards to read instead of copies of the shared shard")
    parser.add_argument("--shard", default=str(SHARED_SHARD), help="the shard to copy --copies times")
    parser.add_argument("--copies", type=int, default=8)
    parser.add_argument("--tokenizer", default=None, help="tokenizer directory (default: train one in --work-dir)")
    parser.add_argument("--actors", type=int, default=2, help="N, the larger number of tokenizers (data.tokenize_actors)")
    parser.add_argument("--reps", type=int, default=1, help="alternating passes per figure (median)")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=8, help="B")
    parser.add_argument("--L", type=int, default=8, help="chunk length")
    parser.add_argument("--quick", action="store_true", help="a small generated corpus, 1 rep")


class CpuMeter:
    """CPU seconds of this process and every process under it (the local Ray cluster it started:
    raylet, actors, tasks), sampled every ``interval`` s by a thread. On a shared box the wall
    clock measures the neighbours as much as the code; tokens per CPU-second do not. A process
    that exits loses at most its last ``interval`` of CPU; one that starts, at most its first."""

    def __init__(self, interval: float = 0.25) -> None:
        import psutil

        self._root = psutil.Process()
        self._interval = interval
        self._first: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-meter", daemon=True)

    def _sample(self) -> None:
        import psutil

        for proc in [self._root, *self._root.children(recursive=True)]:
            try:
                t = proc.cpu_times()
            except psutil.Error:
                continue
            self._first.setdefault(proc.pid, t.user + t.system)
            self._last[proc.pid] = t.user + t.system

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._sample()

    def __enter__(self) -> CpuMeter:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    @property
    def seconds(self) -> float:
        return sum(self._last[p] - self._first[p] for p in self._last)


def plain_loop(shards: list[Any], cfg: Any, tokenizer_dir: str) -> dict[str, float]:
    """Read, decompress, parse and batch-encode every document in this process; tokens incl. EOS."""
    from d3ray.data.records import iter_documents
    from d3ray.data.tokenizer import encode_texts, load_backend_tokenizer

    backend, _ = load_backend_tokenizer(tokenizer_dir)
    start = time.perf_counter()
    tokens = 0
    texts: list[str] = []
    for shard in shards:
        for doc in iter_documents(shard, cfg.layout, cfg.domains, cfg.max_record_bytes):
            if doc.is_bad:
                continue
            texts.append(doc.text)
            if len(texts) == cfg.tokenize_batch_size:
                tokens += sum(len(ids) + 1 for ids in encode_texts(backend, texts))
                texts = []
    if texts:
        tokens += sum(len(ids) + 1 for ids in encode_texts(backend, texts))
    seconds = time.perf_counter() - start
    return {"tokens": tokens, "seconds": seconds, "tokens_per_sec": tokens / seconds}


def stream_pass(make: Callable[[dict | None], Any], chunks_wanted: int | None = None) -> dict[str, Any]:
    """Iterate a fresh ChunkStream through epoch 0 and into epoch 1's first chunk (or, mixed,
    ``chunks_wanted`` chunks); times, tokens and the chunk cursors."""
    stream = make(None)
    start = time.perf_counter()
    at: list[float] = []
    tokens = 0
    per_chunk: list[int] = []
    cursors: list[dict] = []
    ids: list[Any] = []
    boundary = None
    for chunk in stream:
        now = time.perf_counter() - start
        if chunks_wanted is not None and len(at) >= chunks_wanted:
            break  # mixed: as many chunks as the plain epoch (its domains wrap on their own)
        if chunks_wanted is None and chunk.epoch > 0:
            boundary = now - at[-1] if at else None
            break
        at.append(now)
        cursors.append(chunk.cursor)
        ids.append([b.sample_ids for b in chunk.batches])
        per_chunk.append(int(sum(int(b.n_tokens.sum()) for b in chunk.batches)))
        tokens += per_chunk[-1]
    lanes = getattr(stream, "domain_lanes", None)  # mixed: read ahead but not drawn yet, and moved domains
    queued = sum(len(s.queue) for s in lanes.shared.values()) if lanes is not None else None
    moved = list(lanes.moved_to_lanes) if lanes is not None else None
    stream.close()
    seconds = at[-1]
    gaps = np.diff(at[1:]) if len(at) > 2 else np.zeros(1)
    w = min(len(at), max(2, int(WINDOW * len(at))))
    window_tokens, window_seconds = sum(per_chunk[:w]), at[w - 1]
    s0 = min(w - 1, max(1, int(STEADY_FROM * len(at))))  # the steady part: chunks s0 .. w - 1
    return {
        "tokens": tokens, "seconds": seconds, "pass_tokens_per_sec": tokens / seconds, "chunks": len(at),
        "window_chunks": w, "window_tokens": window_tokens, "tokens_per_sec": window_tokens / window_seconds,
        "steady_tokens_per_sec": sum(per_chunk[s0:w]) / max(window_seconds - at[s0 - 1], 1e-9),
        "first_chunk_sec": at[0], "mean_chunk_gap_sec": float(gaps.mean()), "epoch_boundary_gap_sec": boundary,
        "chunk_times": at, "cursors": cursors, "chunk_ids": ids,
        "queued_sequences_at_end": queued, "moved_to_lanes": moved,
    }


def resume_costs(make: Callable[[dict | None], Any], run: dict[str, Any],
                 fractions: tuple[float, ...] = (0.0, 0.1, 0.5, 0.9)) -> list[dict[str, Any]]:
    """Seconds to the first chunk of a stream started at cursors ``fractions`` into the epoch; the
    first chunk must be the one the cursor belongs to, with the same sample ids."""
    out = []
    n = run["chunks"]
    for frac in fractions:
        k = min(n - 1, int(frac * n))
        cursor = json.loads(json.dumps(run["cursors"][k]))
        start = time.perf_counter()
        stream = make(cursor)
        first = next(iter(stream))
        seconds = time.perf_counter() - start
        stream.close()
        if first.chunk_id != k or [b.sample_ids for b in first.batches] != run["chunk_ids"][k]:
            raise RuntimeError(f"the stream resumed at chunk {k}'s cursor yields another chunk ({first.chunk_id})")
        out.append({"fraction": frac, "chunk": k, "tokens_before": int(k * run["tokens"] / n),
                    "cursor_json_bytes": len(json.dumps(cursor)), "resume_sec": seconds,
                    "reread_to_reach_sec": run["chunk_times"][k] - run["chunk_times"][0]})
    return out


def natural_mixture(shards: list[Any], cfg: Any, tokenizer_dir: str) -> dict[str, float]:
    """Token share of each domain in the first shard (the mixture that keeps lanes in step)."""
    from d3ray.data.records import iter_documents
    from d3ray.data.tokenizer import encode_texts, load_backend_tokenizer

    backend, _ = load_backend_tokenizer(tokenizer_dir)
    counts: dict[str, int] = {}
    docs = [d for d in iter_documents(shards[0], cfg.layout, cfg.domains, cfg.max_record_bytes) if not d.is_bad]
    for doc, ids in zip(docs, encode_texts(backend, [d.text for d in docs]), strict=True):
        counts[doc.domain] = counts.get(doc.domain, 0) + len(ids) + 1
    total = sum(counts.values())
    mixture = {d: c / total for d, c in counts.items()}
    biggest = max(mixture, key=mixture.__getitem__)
    mixture[biggest] += 1.0 - sum(mixture.values())
    return mixture


def _corpus(args: argparse.Namespace, work: Path) -> tuple[list[Any], Any, str]:
    import dataclasses

    from d3ray.data.config import DataConfig, TokenizerConfig
    from d3ray.data.sample import write_sample_corpus
    from d3ray.data.shards import list_shards
    from d3ray.data.tokenizer import ensure_tokenizer

    cfg = DataConfig(seq_len=args.seq_len)
    if args.quick:
        root = work / "quick"
        if not (root / "train").exists():
            write_sample_corpus(root, seed=0, train_docs=300, validation_docs=7, train_shards=2)
        paths = [str(root / "train")]
        cfg = dataclasses.replace(cfg, tokenizer=TokenizerConfig(vocab_size=400, train_docs=200))
    elif args.data:
        paths = [args.data]
    else:
        src = Path(args.shard)
        if not src.is_file():
            raise SystemExit(f"no shard at {src}: pass --shard FILE, --data PATH or --quick")
        folder = work / f"copies{args.copies}" / "train" / "chunk1"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(args.copies):
            dst = folder / f"example_train_{i}.jsonl.zst"
            if not dst.exists():
                shutil.copyfile(src, dst)
        paths = [str(folder.parent)]
    cfg = dataclasses.replace(cfg, train_paths=paths)
    shards = list_shards(paths)
    if args.tokenizer:
        cfg = dataclasses.replace(cfg, tokenizer=dataclasses.replace(cfg.tokenizer, path=args.tokenizer))
    tokenizer_dir = ensure_tokenizer(cfg, shards, work / ("quick_run" if args.quick else "run"))
    return shards, cfg, str(tokenizer_dir)


def run(args: argparse.Namespace) -> int:
    import dataclasses

    import ray

    from d3ray.data.chunker import ChunkStream
    from d3ray.data.corpus_source import CorpusSource

    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # the plain loop and each tokenizer: one core
    os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
    reps = 1 if args.quick else args.reps
    work = Path(args.work_dir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    shards, cfg, tok = _corpus(args, work)
    mixture = natural_mixture(shards, cfg, tok)
    if args.quick:  # two lanes are enough to exercise mixing, and start faster than seven
        top = sorted(mixture, key=mixture.__getitem__)[-2:]
        mixture = {d: mixture[d] / sum(mixture[t] for t in top) for d in top}
        mixture[top[-1]] = 1.0 - mixture[top[0]]
    owns_ray = not ray.is_initialized()
    if owns_ray:
        ray.init(address="local", num_cpus=max(4, os.cpu_count() or 1), include_dashboard=False, log_to_driver=False)

    def maker(actors: int, mixed: bool, span: int | None = None) -> Callable[[dict | None], ChunkStream]:
        data = dataclasses.replace(cfg, tokenize_actors=actors)
        return lambda cursor: ChunkStream(
            CorpusSource(shards, data, tok), args.batch_size, args.L, seed=0,
            mixture_for_chunk=(lambda c: mixture) if mixed else None, cursor=cursor, shared_span_blocks=span)

    variants = {"stream_1": (1, False, None), f"stream_{args.actors}": (args.actors, False, None),
                "mixed_1": (1, True, None), f"mixed_{args.actors}": (args.actors, True, None),
                "lanes_1": (1, True, 0)}
    passes: dict[str, list[dict[str, Any]]] = {k: [] for k in ["plain", *variants]}
    plain_task = ray.remote(plain_loop).options(num_cpus=1)
    try:
        # Warm-up, untimed: the first stream of a fresh Ray instance also starts its worker processes
        # (each imports ray.data, tokenizers, d3ray), which every later variant reuses; timing it as
        # the first variant would charge that to whichever runs first.
        ray_cold = stream_pass(maker(args.actors, False), chunks_wanted=2)["first_chunk_sec"]
        print(f"warm-up: a fresh Ray instance's first chunk after {ray_cold:.2f}s (not timed below)", flush=True)
        for rep in range(reps):
            with CpuMeter() as meter:
                passes["plain"].append(ray.get(plain_task.remote(shards, cfg, tok)))
            passes["plain"][-1]["cpu_sec"] = meter.seconds
            print(f"rep {rep}: plain {passes['plain'][-1]['tokens_per_sec']:,.0f} tok/s", flush=True)
            chunks_wanted = None
            for name, (actors, mixed, span) in variants.items():
                with CpuMeter() as meter:
                    result = stream_pass(maker(actors, mixed, span), chunks_wanted if mixed else None)
                result["cpu_sec"] = meter.seconds
                if not mixed and chunks_wanted is None:
                    chunks_wanted = result["chunks"]  # mixed: as many chunks as the plain epoch
                passes[name].append(result)
                print(f"rep {rep}: {name} {result['tokens_per_sec']:,.0f} tok/s", flush=True)
        resume = resume_costs(maker(1, False), passes["stream_1"][-1], (0.0, 0.5) if args.quick else (0.0, 0.1, 0.5, 0.9))
        cold = statistics.median(p["first_chunk_sec"] for p in passes["stream_1"])
    finally:
        if owns_ray:
            ray.shutdown()

    def med(name: str, key: str) -> float:
        values = [p[key] for p in passes[name] if p.get(key) is not None]
        return float(statistics.median(values)) if values else float("nan")

    plain_tps = med("plain", "tokens_per_sec")
    plain_tpc = statistics.median(p["tokens"] / p["cpu_sec"] for p in passes["plain"])
    report: dict[str, Any] = {
        "shards": len(shards), "tokens_plain_loop": passes["plain"][-1]["tokens"], "reps": reps,
        "seq_len": args.seq_len, "B": args.batch_size, "L": args.L, "mixture": mixture,
        "plain_tokens_per_sec": plain_tps, "plain_tokens_per_cpu_sec": plain_tpc,
    }
    for name in variants:
        report[name] = {k: med(name, k) for k in ("tokens_per_sec", "steady_tokens_per_sec", "pass_tokens_per_sec",
                                                   "window_chunks", "seconds", "tokens",
                                                   "chunks", "first_chunk_sec", "mean_chunk_gap_sec",
                                                   "epoch_boundary_gap_sec")}
        report[name]["ratio_to_plain"] = report[name]["tokens_per_sec"] / plain_tps
        report[name]["steady_ratio_to_plain"] = report[name]["steady_tokens_per_sec"] / plain_tps
        report[name]["tokens_per_cpu_sec"] = statistics.median(p["tokens"] / p["cpu_sec"] for p in passes[name])
        report[name]["cpu_ratio_to_plain"] = report[name]["tokens_per_cpu_sec"] / plain_tpc
        if variants[name][1]:
            last = passes[name][-1]
            report[name]["queued_sequences_at_end"] = last["queued_sequences_at_end"]
            report[name]["moved_to_lanes"] = last["moved_to_lanes"]
    for n in (1, args.actors):
        report[f"mixed_cost_{n}"] = 1 - report[f"mixed_{n}"]["tokens_per_sec"] / report[f"stream_{n}"]["tokens_per_sec"]
        report[f"mixed_cpu_cost_{n}"] = (1 - report[f"mixed_{n}"]["tokens_per_cpu_sec"]
                                         / report[f"stream_{n}"]["tokens_per_cpu_sec"])
    report["lanes_cost_1"] = 1 - report["lanes_1"]["tokens_per_sec"] / report["stream_1"]["tokens_per_sec"]
    report["resume"] = resume
    report["cold_start_sec"] = cold
    report["ray_cold_start_sec"] = ray_cold
    report["targets"] = {"stream_1.ratio_to_plain": ">= 0.9", "mixed_cost_1": "< 0.05",
                         "epoch_boundary_gap_sec": "about mean_chunk_gap_sec, far below cold_start_sec"}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"\n{'':14}{'tok/s':>12}{'ratio':>8}{'steady':>8}{'tok/cpu-s':>11}{'ratio':>7}{'first s':>9}"
          f"{'gap s':>8}{'epoch gap s':>12}")
    print(f"{'plain loop':14}{plain_tps:>12,.0f}{1.0:>8.2f}{'':>8}{plain_tpc:>11,.0f}{1.0:>7.2f}")
    for name in variants:
        r = report[name]
        print(f"{name:14}{r['tokens_per_sec']:>12,.0f}{r['ratio_to_plain']:>8.2f}{r['steady_ratio_to_plain']:>8.2f}"
              f"{r['tokens_per_cpu_sec']:>11,.0f}{r['cpu_ratio_to_plain']:>7.2f}{r['first_chunk_sec']:>9.2f}"
              f"{r['mean_chunk_gap_sec']:>8.3f}{r['epoch_boundary_gap_sec']:>12.3f}")
    for name in (n for n in variants if variants[n][1] and variants[n][2] is None):
        print(f"{name}: {report[name]['queued_sequences_at_end']:,} sequences read ahead into the shared reader's "
              f"queues at the end (not drawn yet: {report[name]['queued_sequences_at_end'] * args.seq_len:,} "
              f"tokens or fewer); domains moved to lanes: {report[name]['moved_to_lanes'] or 'none'}")
    print("mixed cost: " + ", ".join(f"{n} tokenizer(s) {report[f'mixed_cost_{n}']:+.1%} wall, "
                                     f"{report[f'mixed_cpu_cost_{n}']:+.1%} CPU" for n in (1, args.actors))
          + f"; a lane per domain (1 tokenizer) {report['lanes_cost_1']:+.1%} wall")
    print("resume: " + ", ".join(f"{r['fraction']:.0%} ({r['tokens_before']:,} tok) {r['resume_sec']:.2f}s "
                                 f"[re-read {r['reread_to_reach_sec']:.1f}s]" for r in resume)
          + f" | cold start {cold:.2f}s (a fresh Ray instance's: {ray_cold:.2f}s)")
    print(f"wrote {args.out}")
    return 0
