"""The census driver: a finished run's directory → branch results on disk (one small JSON per branch).

    run dir ─► config.yaml, checkpoint_*/state.json (next_chunk, data cursor), schedule_log.jsonl (orders)
       │  checks first (one-line UserError, before Ray starts): checkpoints exist, the chunks asked for lie
       │  inside the run's stream, the run's schedule orders whole chunks, the --eval files exist
       ▼
    for each checkpoint K: the run's own stream from K's data cursor ─► chunks K .. K+N+T−1 (object store)
       │  CensusWorker actors (each loads a checkpoint once, keeps it in memory):
       │    orders(chunk)  ─► <out>/branches/k<K>/c<c>/orders.json   (S, D3's and the look-ahead's order)
       │    branch(order)  ─► <out>/branches/k<K>/c<c>/<name>.json   (held-out losses after the chunk)
       ▼
    report.py rebuilds census.json, results.md and the plots from those files

A rerun with the same options skips every branch (and every S) already on disk.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from d3ray.config import RunConfig
from d3ray.errors import DataPathError, UserError
from d3ray.lab.census.orders import (
    MAX_ALL_ORDERS_L,
    all_orders,
    census_orders,
    control_domain,
    distinct_orders,
    random_orders,
    recency_orders,
)
from d3ray.lab.census.planted import PLANTED_KINDS, plant_chunk, planted_orders, planting
from d3ray.lab.census.ramp import ramp_chunk
from d3ray.lab.census.restore import check_checkpoint
from d3ray.lab.schedule_questions import census_schedule_types, permutes_stream_batches

logger = logging.getLogger(__name__)

@dataclass(frozen=True)
class CensusOptions:
    """What to branch: which checkpoints, how many chunks after each, which orders."""

    run_dir: Path
    out: Path
    checkpoints: list[int] | None = None
    """Checkpoints by chunk (a checkpoint K holds the state before chunk K); None = ``num_checkpoints``
    evenly spaced past ``warmup_chunks``."""
    num_checkpoints: int = 3
    warmup_chunks: int | None = None
    """Chunks before the first automatic checkpoint (default: a quarter of the run's chunks)."""
    chunks: int = 1
    """N: chunks branched after each checkpoint (each from the checkpoint's state)."""
    random_orders: int = 8
    """R: seeded random orders per chunk (the reference distribution)."""
    all_orders: bool = False
    """Also every one of the L! orders (L <= 5)."""
    lookahead: bool = True
    """Also D3 with the exact look-ahead estimator (and its reverse and alternating orders)."""
    persist: int = 0
    """T: chunks trained after each branch in the run's own orders, then evaluated again."""
    eval_files: list[str] = field(default_factory=list)
    control: str | None = None
    """A positive control with a known answer: ``recency`` (orders that train one domain's batches last
    must win on that domain's held-out loss) or ``planted`` (one batch of each branched chunk broken:
    its position in an order must move the held-out loss)."""
    control_domain: str | None = None
    """The recency control's domain (default: per chunk, the domain whose count per batch varies most)."""
    recency_layout: str = "stream"
    """The recency control's batches: ``stream`` (the chunk's own) or ``ramp`` (its sequences re-dealt so the
    control domain's count rises linearly over the batches, ramp.py; needs ``control_domain``)."""
    planted_kind: str = "shuffled"
    """The planted control's batch: ``shuffled`` (each sequence's tokens permuted) or ``repeated`` (one id)."""
    planted_batch: int | None = None
    """The planted control's batch by stream index 0..L−1 (default: per chunk, drawn from ``seed``)."""
    workers: int = 2
    cpus_per_worker: float = 1.0
    seed: int = 0


@dataclass(frozen=True)
class RunInfo:
    """What the census reads from the run directory."""

    cfg: RunConfig
    checkpoints: dict[int, Path]
    """next_chunk → checkpoint directory (chunk-boundary checkpoints only)."""
    run_orders: dict[int, tuple[int, ...]]
    whole_chunks: int
    """Whole chunks the run trained: chunks 0 .. whole_chunks − 1, ⌊train.steps / L⌋. Not the run's chunk
    count, ``d3ray.data.chunker.total_chunks`` (⌈train.steps / L⌉): a last chunk that train.steps cut short
    holds no census window."""


def load_run(run_dir: Path) -> RunInfo:
    """The run's config, its chunk-boundary checkpoints and the orders it trained (schedule log).

    Raises:
        DataPathError: no such run directory, no ``config.yaml``, or no checkpoint.
    """
    from d3ray.config_loading import load_config
    from d3ray.run_files import read_jsonl

    run_dir = Path(run_dir).resolve()
    if not (run_dir / "config.yaml").is_file():
        raise DataPathError(f"{run_dir}: not a run directory (no config.yaml); pass the directory a pretrain wrote")
    cfg = load_config(RunConfig, run_dir / "config.yaml")
    cfg = dataclasses.replace(cfg, output_dir=str(run_dir.parent), name=run_dir.name)
    checkpoints: dict[int, tuple[int, Path]] = {}
    for state_file in sorted(run_dir.glob("checkpoint_*/state.json")):
        state = json.loads(state_file.read_text())
        if state.get("position", 0) != 0:
            continue  # the run's end inside a chunk: not a chunk boundary
        key = int(state["next_chunk"])
        if key not in checkpoints or state["step"] > checkpoints[key][0]:
            checkpoints[key] = (int(state["step"]), state_file.parent)
    if not checkpoints:
        raise DataPathError(f"{run_dir}: the run has no checkpoint at a chunk boundary (checkpoint_*/state.json); "
                            "train with train.checkpoint_every_chunks and train.keep_checkpoints large enough")
    log = run_dir / "schedule_log.jsonl"
    run_orders = {int(r["chunk_id"]): tuple(int(i) for i in r["order"]) for r in read_jsonl(log)} if log.is_file() else {}
    return RunInfo(cfg=cfg, checkpoints={k: v[1] for k, v in sorted(checkpoints.items())}, run_orders=run_orders,
                   whole_chunks=cfg.train.steps // cfg.schedule.L)


def choose_checkpoints(available: list[int], whole_chunks: int, chunks: int, persist: int,
                       requested: list[int] | None, count: int, warmup: int | None) -> list[int]:
    """The checkpoints K to branch from: ``requested`` (each must exist and leave K + chunks + persist
    inside the run's ``whole_chunks``), or ``count`` evenly spaced among those at or past ``warmup``.

    Raises:
        UserError: a requested checkpoint does not exist, or its chunks run past the end of the stream.
    """
    need = chunks + persist
    if requested:
        for K in requested:
            if K not in available:
                raise UserError(f"census: the run has no checkpoint at chunk {K} (it has {available}); "
                                "pick one of those with --checkpoints")
            if K + need > whole_chunks:
                raise UserError(f"census: chunks {K}..{K + need - 1} (checkpoint {K} + {chunks} chunks + {persist} "
                                f"persist) run past the end of the run's stream (chunks 0..{whole_chunks - 1})")
        return sorted(set(requested))
    start = whole_chunks // 4 if warmup is None else warmup
    fits = [K for K in available if K >= start and K + need <= whole_chunks]
    if not fits:
        raise UserError(f"census: no checkpoint at or past chunk {start} leaves {need} chunks before the end of the "
                        f"run's stream (chunks 0..{whole_chunks - 1}; checkpoints at {available}); lower "
                        "--chunks / --persist / --warmup-chunks or give --checkpoints")
    picks = np.unique(np.round(np.linspace(0, len(fits) - 1, min(count, len(fits)))).astype(int))
    return [fits[i] for i in picks]


def check_trunk_checkpoints(cfg: RunConfig, checkpoints: list[int] | None) -> None:
    """Before ``--config``'s run is trained: it must keep a checkpoint at each requested chunk K (the state
    before chunk K, written after K chunks) at the end. Checked for checkpoints counted in chunks; by steps
    or seconds the run's own checkpoints decide, and ``load_run`` checks them after training.

    Raises:
        ConfigError: a K that is no checkpoint of the run, or older than the ``keep_checkpoints`` it keeps.
    """
    from d3ray.config_loading import ConfigError
    from d3ray.data.chunker import total_chunks

    train = cfg.train
    if not checkpoints or train.checkpoint_every_steps or train.checkpoint_every_sec:
        return
    every, total = train.checkpoint_every_chunks, total_chunks(train.steps, cfg.schedule.L)
    boundaries = sorted({*range(every, total + 1, every), total})
    missing = [K for K in checkpoints if K not in boundaries or K >= total]
    if missing:
        raise ConfigError(f"census: the run checkpoints every {every} chunks of {total}: no checkpoint before chunk(s) "
                          f"{missing}; set train.checkpoint_every_chunks or pick --checkpoints among {boundaries[:-1]}")
    kept = boundaries[-train.keep_checkpoints:]
    if min(checkpoints) < kept[0]:
        needed = len([b for b in boundaries if b >= min(checkpoints)])
        raise ConfigError(f"census: the run keeps its last {train.keep_checkpoints} checkpoints (chunks {kept}), not "
                          f"the one before chunk {min(checkpoints)}; set train.keep_checkpoints={needed}")


def check_inputs(info: RunInfo, options: CensusOptions) -> list[int]:
    """Every check that needs no Ray and no training; the checkpoints to branch from."""
    schedule = info.cfg.schedule
    if not permutes_stream_batches(schedule):  # any other order of the same batches is a counterfactual then
        runs_of = census_schedule_types()
        raise UserError(f"census: the run's schedule.type={schedule.type_name} does not train its chunks as an order "
                        f"of the stream's batches; the census branches runs of {', '.join(runs_of)}")
    for path in options.eval_files:
        if not Path(path).is_file():
            raise DataPathError(f"census: --eval {path}: no such file")
    if options.persist < 0:
        raise UserError(f"census: --persist {options.persist} must be >= 0")
    if options.all_orders and schedule.L > MAX_ALL_ORDERS_L:
        raise UserError(f"census: --all-orders needs L <= {MAX_ALL_ORDERS_L} (the run's schedule.L={schedule.L})")
    if options.control not in (None, "recency", "planted"):
        raise UserError(f"census: --control {options.control}: unknown control (known: recency, planted)")
    if options.control == "planted":
        if options.planted_kind not in PLANTED_KINDS:
            raise UserError(f"census: --planted-kind {options.planted_kind}: one of {', '.join(PLANTED_KINDS)}")
        if options.planted_batch is not None and not 0 <= options.planted_batch < schedule.L:
            raise UserError(f"census: --planted-batch {options.planted_batch} is not a stream index of a chunk "
                            f"(0..{schedule.L - 1})")
    elif options.planted_batch is not None or options.planted_kind != "shuffled":
        raise UserError("census: --planted-batch / --planted-kind belong to --control planted")
    if options.recency_layout not in RECENCY_LAYOUTS:
        raise UserError(f"census: --recency-layout {options.recency_layout}: one of {', '.join(RECENCY_LAYOUTS)}")
    if options.recency_layout == "ramp" and (options.control != "recency" or options.control_domain is None):
        raise UserError("census: --recency-layout ramp re-deals one domain's sequences: it needs --control recency "
                        "and --control-domain NAME")
    if options.chunks < 1 or options.random_orders < 2:
        raise UserError("census: --chunks must be >= 1 and --random-orders >= 2 (a spread needs two)")
    check_out_dir(options, schedule.L)
    Ks = choose_checkpoints(sorted(info.checkpoints), info.whole_chunks, options.chunks, options.persist,
                            options.checkpoints, options.num_checkpoints, options.warmup_chunks)
    for K in Ks:  # the branches' checkpoints, and the next ones the run's own order is compared with
        for k in (K, K + 1):
            if k in info.checkpoints:
                check_checkpoint(info.checkpoints[k])
    return Ks


RECENCY_LAYOUTS = ("stream", "ramp")


def chunk_planting(options: CensusOptions, L: int, chunk_id: int) -> dict[str, Any] | None:
    """What the planted control plants in chunk ``chunk_id`` (None without ``--control planted``)."""
    if options.control != "planted":
        return None
    return planting(options.planted_kind, L, options.seed, chunk_id, options.planted_batch)


def chunk_layout(options: CensusOptions) -> dict[str, Any] | None:
    """How the recency control re-deals each branched chunk's sequences (None: the stream's own batches)."""
    if options.control != "recency" or options.recency_layout == "stream":
        return None
    return {"kind": options.recency_layout, "domain": options.control_domain}


def _describe(plant: dict[str, Any] | None) -> str:
    return "unplanted chunks" if plant is None else f"a {plant['kind']} batch planted at stream index {plant['index']}"


def _describe_layout(layout: dict[str, Any] | None) -> str:
    return "the stream's batches" if layout is None else f"a {layout['kind']} of {layout['domain']}'s sequences"


def check_out_dir(options: CensusOptions, L: int) -> None:
    """Refuse an ``--out`` whose chunks were planted otherwise than this census plants them (a planted
    census next to an unplanted one, another kind, batch or seed): their branches trained other batches.

    Raises:
        UserError: the first chunk whose ``orders.json`` holds another planting.
    """
    for path in sorted(Path(options.out).glob("branches/k*/c*/orders.json")):
        chunk_id = int(path.parent.name[1:])
        computed = read_json(path) or {}
        for key, want, describe in (("planted", chunk_planting(options, L, chunk_id), _describe),
                                    ("layout", chunk_layout(options), _describe_layout)):
            if computed.get(key) != want:
                raise UserError(f"census: {options.out} holds chunk {chunk_id} with {describe(computed.get(key))}, and "
                                f"this census trains it with {describe(want)}; pass the --control / --planted-* / "
                                "--recency-layout / --seed that directory was made with, or give this census an --out "
                                "of its own")


def branch_dir(out: Path, checkpoint: int, chunk_id: int) -> Path:
    return Path(out) / "branches" / f"k{checkpoint:05d}" / f"c{chunk_id:05d}"


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` to ``path`` atomically (a stopped census never leaves half a file to skip)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text()) if Path(path).is_file() else None


def chunk_orders(options: CensusOptions, L: int, K: int, chunk_id: int, run_order: tuple[int, ...] | None,
                 computed: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Name → order of one chunk's branches (see :func:`d3ray.lab.census.orders.census_orders`)."""
    named = census_orders(
        L, run=run_order, d3=computed.get("d3"), lookahead=computed.get("lookahead"),
        random=random_orders(L, options.random_orders, options.seed, K, chunk_id),
        every=all_orders(L) if options.all_orders else ())
    if options.control == "recency":
        domains = computed["batch_domains"]
        named.update(recency_orders(domains, control_domain(domains, options.control_domain)))
    if options.control == "planted":
        named.update(planted_orders(L, int(computed["planted"]["index"])))
    return named


def branches_to_train(options: CensusOptions, info: RunInfo, K: int, chunk_id: int) -> list[tuple[tuple[int, ...], list[str]]]:
    """The distinct orders of chunk ``chunk_id`` from checkpoint ``K`` with no branch file yet (a file
    counts when it holds the same order; names added since, e.g. by ``--control``, are written into it
    without training again); [((), [])] when S is not computed yet."""
    bdir = branch_dir(options.out, K, chunk_id)
    computed = read_json(bdir / "orders.json")
    if computed is None or (options.control and "batch_domains" not in computed):
        return [((), [])]
    named = chunk_orders(options, info.cfg.schedule.L, K, chunk_id, info.run_orders.get(chunk_id), computed)
    todo = []
    for order, names in distinct_orders(named):
        done = read_json(bdir / f"{names[0]}.json")
        if done is None or tuple(done["order"]) != order or lacks_read_outs(done, options):
            todo.append((order, names))
        elif sorted(done["names"]) != sorted(names):  # a new name for an order trained already (a control's)
            write_json(bdir / f"{names[0]}.json", {**done, "names": list(names)})
    return todo


def lacks_read_outs(done: dict[str, Any], options: CensusOptions) -> bool:
    """Whether a finished branch misses a read-out this census asks for (``--persist`` added since it was
    trained), or failed for a reason other than its order (its worker died): then
    it is trained again."""
    if done.get("status") != "ok":
        return bool(done.get("retry"))  # a worker that died, not the order: trained again
    return bool(options.persist and "persist_eval" not in done)


def stream_chunks(info: RunInfo, prepared: Any, K: int, count: int) -> list[Any]:
    """Chunks K .. K+count−1 of the run's own stream, read from checkpoint K's data cursor (from the
    start when the checkpoint has none)."""
    from d3ray.data.chunk_stream import build_chunk_stream

    cfg = info.cfg
    state = json.loads((info.checkpoints[K] / "state.json").read_text())
    cursor_info = state.get("schedule", {}).get("data_cursor")
    cursor = cursor_info["cursor"] if cursor_info and int(cursor_info["chunk_id"]) == K else None
    stream = build_chunk_stream(prepared.train_shards, prepared.data, str(prepared.tokenizer_dir),
                                cfg.train.global_batch_size, cfg.schedule.window_batches(), cfg.schedule.shuffle_buffer,
                                cfg.seed, prepared.sft, cursor=cursor)
    out = []
    try:
        for chunk in stream:
            if chunk.chunk_id >= K:
                out.append(chunk)
            if chunk.chunk_id >= K + count - 1:
                break
    finally:
        stream.close()
    if [c.chunk_id for c in out] != list(range(K, K + count)):
        raise UserError(f"census: the run's stream ended before chunk {K + count - 1} "
                        f"(it yielded chunks {[c.chunk_id for c in out]} from checkpoint {K})")
    return out


def run_census(options: CensusOptions) -> dict[str, Any]:
    """Check, branch every (checkpoint, chunk, order) not on disk yet, and write the report."""
    import ray

    from d3ray.lab.census.pool import WorkerPool, describe_error
    from d3ray.lab.census.worker import BranchTask, CensusWorker, ChunkData
    from d3ray.model import model_config_dict
    from d3ray.run.cluster import start_ray, worker_env
    from d3ray.run.prepare import load_eval_sets, prepare_data
    from d3ray.schedule.order.d3 import ActorsPlacement, D3ScheduleConfig

    info = load_run(options.run_dir)
    Ks = check_inputs(info, options)
    cfg = info.cfg
    cfg_eval = dataclasses.replace(cfg, eval=dataclasses.replace(
        cfg.eval, ood_text_paths=[*cfg.eval.ood_text_paths, *(str(Path(p).resolve()) for p in options.eval_files)]))
    prepared = prepare_data(cfg)
    eval_sets = load_eval_sets(cfg_eval, prepared)
    if not eval_sets:
        raise UserError(f"census: the run {options.run_dir} has no held-out sets (data.validation_paths, "
                        "eval.ood_text_paths) and no --eval file was given: nothing to measure the branches on")
    if options.control == "recency" and options.control_domain is not None and options.control_domain not in eval_sets:
        raise UserError(f"census: --control-domain {options.control_domain} has no held-out set in the run (it has: "
                        f"{', '.join(sorted(eval_sets))}): the recency control reads that domain's held-out loss")
    model_config = model_config_dict(cfg.model, prepared.vocab_size, prepared.data.seq_len, prepared.eos_id)
    d3 = cfg.schedule if isinstance(cfg.schedule, D3ScheduleConfig) else D3ScheduleConfig(L=cfg.schedule.L)
    # a D3 run's snapshot dtype (its actors'; an in-trainer run's D3 reads the actors' default), else float32
    snapshot_dtype = (getattr(d3.placement, "snapshot_dtype", ActorsPlacement().snapshot_dtype)
                      if isinstance(cfg.schedule, D3ScheduleConfig) else "float32")
    L = cfg.schedule.L
    options.out.mkdir(parents=True, exist_ok=True)
    if not any(branches_to_train(options, info, K, c) for K in Ks for c in range(K, K + options.chunks)):
        print(f"census: every branch of {len(Ks)} checkpoints × {options.chunks} chunks is in {options.out} already",
              flush=True)
        return {"checkpoints": Ks, "L": L, "trained": 0}
    env = worker_env(cfg)
    owns_ray = start_ray(cfg.ray, env)
    try:
        eval_ref = [ray.put(eval_sets)]
        remote = ray.remote(CensusWorker).options(num_cpus=options.cpus_per_worker, runtime_env={"env_vars": env},
                                                  num_gpus=cfg.train.gpus_per_worker if cfg.train.use_gpu else 0)
        pool = WorkerPool(lambda: remote.remote(cfg, model_config, eval_ref, str(options.out)), options.workers)
        data: dict[tuple[int, int], ChunkData] = {}
        layout = chunk_layout(options)
        for K in Ks:
            chunks = stream_chunks(info, prepared, K, options.chunks + options.persist)
            for chunk in chunks:
                if chunk.size != L:
                    raise UserError(f"census: chunk {chunk.chunk_id} holds {chunk.size} batches, not L={L} (the end "
                                    "of a data epoch); pick other checkpoints")
                batches = list(chunk.batches)
                plant = chunk_planting(options, L, chunk.chunk_id)
                if plant is not None and chunk.chunk_id < K + options.chunks:  # branched chunks only, not persist
                    batches = plant_chunk(batches, plant)
                if layout is not None and chunk.chunk_id < K + options.chunks:
                    batches = ramp_chunk(batches, layout["domain"])
                data[(K, chunk.chunk_id)] = ChunkData(chunk.chunk_id, [ray.put(b) for b in batches],
                                                      info.run_orders.get(chunk.chunk_id, tuple(range(L))))
        # S and D3's orders of every branched chunk, at its checkpoint's weights.
        wanted = [(K, c) for K in Ks for c in range(K, K + options.chunks)
                  if branches_to_train(options, info, K, c) == [((), [])]]
        for attempt in (1, 2):  # a worker that dies computing S: that chunk's S once more, on a new worker
            failed = []
            for (K, c), computed, error in pool.map(
                    lambda a, kc: a.orders.remote(str(info.checkpoints[kc[0]]), data[kc], d3.influence, d3.solver,
                                                  d3.solver_seed, snapshot_dtype, options.lookahead), wanted):
                if error is not None:
                    if attempt == 2:
                        raise UserError(f"census: S of chunk {c} from checkpoint {K} failed twice: {describe_error(error)}")
                    print(f"census: S of chunk {c} failed ({describe_error(error)}); computing it again", flush=True)
                    failed.append((K, c))
                    continue
                computed["planted"] = chunk_planting(options, L, c)
                computed["layout"] = layout
                write_json(branch_dir(options.out, K, c) / "orders.json", computed)
            wanted = failed
            if not wanted:
                break
        # The branches not on disk yet.
        tasks = []
        for K in Ks:
            for c in range(K, K + options.chunks):
                for order, names in branches_to_train(options, info, K, c):
                    compare = None
                    if ("run" in names and c == K and (c + 1) in info.checkpoints and options.control != "planted"
                            and layout is None):
                        compare = str(info.checkpoints[c + 1])
                    persist = tuple(data[(K, c + 1 + t)] for t in range(options.persist))
                    tasks.append(BranchTask(checkpoint=str(info.checkpoints[K]), chunk=data[(K, c)], order=order,
                                            names=tuple(names), persist=persist, compare_to=compare))
        print(f"census: {len(Ks)} checkpoints × {options.chunks} chunks, {len(tasks)} branches to train "
              f"on {len(pool.actors)} workers", flush=True)
        done_count = 0
        for task, result, error in pool.map(lambda a, t: a.branch.remote(t), tasks):
            if error is not None:  # reported as failed; a rerun trains it again
                result = {"checkpoint": task.checkpoint, "chunk_id": task.chunk.chunk_id, "order": list(task.order),
                          "names": list(task.names), "status": "failed", "reason": describe_error(error), "retry": True}
            K = next(k for k in Ks if str(info.checkpoints[k]) == task.checkpoint)
            result["checkpoint_chunk"] = K
            write_json(branch_dir(options.out, K, task.chunk.chunk_id) / f"{task.names[0]}.json", result)
            done_count += 1
            if result["status"] != "ok":
                print(f"branch {task.names[0]} of chunk {task.chunk.chunk_id} failed: {result.get('reason')}", flush=True)
            if done_count % 10 == 0 or done_count == len(tasks):
                print(f"census: {done_count}/{len(tasks)} branches", flush=True)
        pool.shutdown()
    finally:
        if owns_ray:
            ray.shutdown()
    return {"checkpoints": Ks, "L": L, "trained": done_count}


def mean_loss(result: dict[str, Any], key: str = "eval") -> float:
    """The branch's mean held-out loss (NaN for a failed branch)."""
    if result.get("status") != "ok":
        return float("nan")
    value = result.get(key, {}).get("mean_loss")
    if value is None:  # only ood sets: their mean
        losses = [v for k, v in result.get(key, {}).items() if k.endswith("/loss")]
        value = float(np.mean(losses)) if losses else float("nan")
    return float(value) if value is not None and math.isfinite(value) else float("nan")
