"""Constants of the capacity model measured on this machine, side by side in one process, with real parts.

- Per bench model (``tiny``, ``small``: the d3ray presets of ``influence_setup.PRESET_OF``; or a preset
  name such as ``gpt2-124m``; at the bench tokenizer's vocabulary, batches of real RedPajama text from
  ``mixed_batches``): the time of one training step (forward + backward + torch AdamW with the trainers'
  hyperparameters, float32), then the influence seconds per scored batch of an
  :class:`~d3ray.influence.worker.InfluenceWorker` with the default
  :class:`~d3ray.influence.config.InfluenceConfig` (``drift``, ``residual: none``, adam, s = 1/8, with
  ``potential: gradient``: the forward+backward per batch the model prices; the default ``step`` costs
  two batched forwards instead, less, measured by ``d3ray bench influence``) at those
  weights and AdamW state, shipped as the trainers ship them (bfloat16 state dict and m, v), through
  ``sketch_batches`` as the pipeline calls it; split into the forward+backward (its own timer), and, timed
  apart on the same tensors, the potential f_i = ⟨g_i, w⟩ (``batch_potential``) and the drift w
  (``drift_direction``, once per chunk).
- Memory copy bandwidth (bw_mem of the model's O(N) work).
- Snapshot bytes/s: ``ray.put`` of a bfloat16 state dict + AdamW state on a local Ray (``init_local_ray``),
  then ``ray.get`` + widening to float32 in an actor (another process), as ``InfluenceWorker.load_weights``
  and ``AdamWState.tensors`` do.
- All-reduce: 2 gloo processes (``torch.multiprocessing``), a scalar-sized payload and a 16 MB one.

Times are the least of their repeats (the least disturbed: the box may be shared); every repeat is kept in
the JSON.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

__all__ = ["AllReduceTiming", "MeasuredConstants", "ModelTiming", "SnapshotTiming", "measured_from_dict"]


@dataclass(frozen=True, kw_only=True)
class ModelTiming:
    """One bench model: a training step and the default influence of one scored batch, same process, same weights."""

    model: str
    preset: str
    config: dict[str, Any]
    """The transformers config dict (shape, vocabulary, context)."""
    params: int
    """d: trainable parameters (all of them scored: no param_filter)."""
    batch_size: int
    seq_len: int
    scored_sequences: int
    step_sec: float
    influence_sec_per_batch: float
    """``sketch_batches`` seconds per batch of a call of ``batches_per_call`` batches, weights loading
    excluded (``load_sec``): the per-call m, v widening and w are spread over its batches."""
    stats_sec_per_batch: float
    """Of which the estimator's forward+backward of the scored sequences."""
    potential_sec_per_batch: float = 0.0
    """f_i = ⟨g_i, w⟩ of one batch (``batch_potential``), timed apart."""
    drift_sec: float = 0.0
    """w (``drift_direction``), once per chunk, timed apart."""
    load_sec: float
    """``load_weights`` of the bfloat16 snapshot (once per chunk per actor)."""
    batches_per_call: int = 1
    repeats: dict[str, list[float]]

    @property
    def potential_sec_per_coordinate(self) -> float:
        return self.potential_sec_per_batch / self.params

    @property
    def drift_sec_per_coordinate(self) -> float:
        return self.drift_sec / self.params

    @property
    def influence_step_ratio(self) -> float:
        return self.influence_sec_per_batch / self.step_sec

    def actor_share(self, L: int) -> float:
        """One actor's measured seconds for a chunk of L batches (load + L batches) / L training steps."""
        return (self.load_sec + L * self.influence_sec_per_batch) / (L * self.step_sec)


@dataclass(frozen=True, kw_only=True)
class SnapshotTiming:
    """``ray.put`` in the driver and ``ray.get`` + copy in an actor of one 16-bit snapshot."""

    bytes: int
    put_sec: float
    get_sec: float

    @property
    def put_bytes_per_sec(self) -> float:
        return self.bytes / self.put_sec

    @property
    def get_bytes_per_sec(self) -> float:
        return self.bytes / self.get_sec

    @property
    def bytes_per_sec(self) -> float:
        """Publish to usable-in-actor: bytes / (put + get)."""
        return self.bytes / (self.put_sec + self.get_sec)


@dataclass(frozen=True, kw_only=True)
class AllReduceTiming:
    """Least seconds of a float32 all-reduce over ``world_size`` gloo processes, per payload size."""

    world_size: int
    sec_by_floats: dict[int, float]

    @property
    def bytes_per_sec(self) -> float:
        """Bus bandwidth from the largest payload, ring formula: 2·(W−1)/W·bytes / sec."""
        floats = max(self.sec_by_floats)
        w = self.world_size
        return 2.0 * (w - 1) / w * 4 * floats / self.sec_by_floats[floats]

    @property
    def latency_sec(self) -> float:
        """Time of the smallest payload (the k-vectors): a latency bound here."""
        return self.sec_by_floats[min(self.sec_by_floats)]


@dataclass(frozen=True, kw_only=True)
class MeasuredConstants:
    device: str
    threads: int
    memory_bytes: float
    copy_bytes_per_sec: float
    """Bytes read + written per second by a large tensor copy."""
    models: list[ModelTiming]
    snapshot: SnapshotTiming
    allreduce: AllReduceTiming | None
    notes: list[str]


def measured_from_dict(raw: dict[str, Any]) -> MeasuredConstants:
    """Inverse of ``dataclasses.asdict`` (the ``measured`` section of the benchmark's JSON)."""
    fields = {f for f in ModelTiming.__dataclass_fields__}
    models = [ModelTiming(**{k: v for k, v in m.items() if k in fields}) for m in raw["models"]]
    ar = raw.get("allreduce")
    return MeasuredConstants(
        device=raw["device"], threads=raw["threads"], memory_bytes=raw["memory_bytes"],
        copy_bytes_per_sec=raw["copy_bytes_per_sec"], models=models,
        snapshot=SnapshotTiming(**{k: raw["snapshot"][k] for k in ("bytes", "put_sec", "get_sec")}),
        allreduce=None if ar is None else AllReduceTiming(
            world_size=ar["world_size"], sec_by_floats={int(k): v for k, v in ar["sec_by_floats"].items()}),
        notes=raw["notes"],
    )


# ---- training step and influence ----------------------------------------------------------------------
def time_model(model: str, corpus: Any, batch_size: int, seq_len: int, device: str, repeats: int,
               batches_per_call: int, seed: int = 0) -> ModelTiming:
    """Train ``repeats + 2`` steps (the first warms up), then time the default influence at those weights."""
    import torch

    from d3ray.influence.config import InfluenceConfig
    from d3ray.influence.drift import batch_potential, drift_direction
    from d3ray.influence.estimators import DriftConfig
    from d3ray.influence.optimizer import AdamWState
    from d3ray.influence.worker import InfluenceWorker, sample_rows
    from d3ray.lab.bench.influence_setup import PRESET_OF, mixed_batches, train_config
    from d3ray.model import ModelConfig, build_model, model_config_dict

    preset = PRESET_OF.get(model, model)  # a bench name (tiny, small) or a d3ray preset (gpt2-124m)
    cfg_dict = model_config_dict(ModelConfig(preset=preset), corpus.vocab_size, seq_len, corpus.eos_id)
    tcfg = train_config(steps=100, schedule_steps=2000)
    torch.manual_seed(seed)
    net = build_model(cfg_dict, ModelConfig(preset=preset)).to(device).train()
    opt = torch.optim.AdamW(net.parameters(), lr=tcfg.lr, betas=tcfg.betas, weight_decay=tcfg.weight_decay)
    rng = np.random.default_rng(seed)
    # On a GPU the trainers run bf16 (DeepSpeed); the influence worker computes in float32 (InfluenceConfig.dtype).
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.startswith("cuda") else contextlib.nullcontext()
    steps = []
    for x_np in mixed_batches(corpus.train, repeats + 2, batch_size, rng):
        x = torch.from_numpy(x_np).to(device)
        _sync(device)
        t0 = time.perf_counter()
        with autocast:
            loss = net(input_ids=x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), tcfg.grad_clip)
        opt.step()
        _sync(device)
        steps.append(time.perf_counter() - t0)
    steps = steps[1:]
    # As the trainers ship a snapshot (d3ray.train.scheduling.snapshot, bfloat16 default): the state dict (a tied
    # lm_head twice) and m, v, each packed into one CPU bfloat16 buffer.
    from d3ray.train.scheduling.snapshot import ship_optimizer_state, ship_state

    state = AdamWState.from_torch(opt, net.named_parameters(), max_grad_norm=tcfg.grad_clip)
    parts = [ship_state(net.state_dict(), "bfloat16"), ship_optimizer_state(state, "bfloat16")]
    del net, opt, state
    # drift, residual none, adam, s = 1/8, the potential from the gradient: the one forward+backward per batch
    # the model prices (the default `potential: step`, two batched forwards, costs less: influence README)
    config = InfluenceConfig(estimator=DriftConfig(potential="gradient"), device=device)
    worker = InfluenceWorker(cfg_dict, config)
    ids = list(range(batches_per_call))
    worker.sketch_batches(parts, mixed_batches(corpus.heldout, batches_per_call, batch_size, rng), ids)  # warm-up
    per: dict[str, list[float]] = {"step_sec": steps, "influence": [], "stats": [], "load": [], "potential": [],
                                   "drift": []}
    for r in range(repeats):
        batches = mixed_batches(corpus.heldout, batches_per_call, batch_size, rng)
        call_ids = [batches_per_call * (r + 1) + i for i in ids]
        t = worker.sketch_batches(parts, batches, call_ids).timings
        per["influence"].append((t["influence/total_sec"] - t["influence/load_sec"]) / batches_per_call)
        per["stats"].append(t["influence/stats_sec"] / batches_per_call)
        per["load"].append(t["influence/load_sec"])
    # The potential and w timed apart, on the worker's own tensors (sketch_chunk has no timer for them).
    params = worker.leaves()
    moments = worker.optimizer.tensors(params, params[next(iter(params))].device, worker.dtype)
    batch = mixed_batches(corpus.heldout, 1, batch_size, rng)[0]
    grad = config.estimator.statistics(worker.objective(batch, 0), params, worker.generator(0)).grad
    for _ in range(repeats + 1):
        _sync(device)
        t0 = time.perf_counter()
        w = drift_direction(params, worker.optimizer, moments)
        _sync(device)
        t1 = time.perf_counter()
        batch_potential(grad, w)
        _sync(device)
        per["drift"].append(t1 - t0)
        per["potential"].append(time.perf_counter() - t1)
    per["drift"], per["potential"] = per["drift"][1:], per["potential"][1:]
    return ModelTiming(
        model=model, preset=preset, config=cfg_dict, params=worker.num_params, batch_size=batch_size,
        seq_len=seq_len, scored_sequences=len(sample_rows(batch_size, config.sample_fraction, 0, 0)),
        step_sec=min(steps), influence_sec_per_batch=min(per["influence"]),
        stats_sec_per_batch=min(per["stats"]), potential_sec_per_batch=min(per["potential"]),
        drift_sec=min(per["drift"]), load_sec=min(per["load"]), batches_per_call=batches_per_call, repeats=per,
    )


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def copy_bytes_per_sec(device: str, numbers: int = 1 << 25, repeats: int = 5) -> float:
    """Bytes read + written per second by ``dst.copy_(src)`` of ``numbers`` float32 (fastest repeat)."""
    import torch

    src = torch.randn(numbers, device=device)
    dst = torch.empty_like(src)
    times = []
    for _ in range(repeats + 1):
        _sync(device)
        t0 = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        times.append(time.perf_counter() - t0)
    return 2 * 4 * numbers / min(times[1:])


# ---- snapshot through Ray -----------------------------------------------------------------------------
class SnapshotReader:
    """Actor: ``ray.get`` a snapshot's parts and widen every tensor to float32 on the host, as
    ``InfluenceWorker.load_weights`` and ``AdamWState.tensors`` do before the host→device copy."""

    def read(self, parts: list) -> tuple[int, float]:
        import ray
        import torch

        from d3ray.influence.optimizer import AdamWState

        t0 = time.perf_counter()
        total = 0
        for value in ray.get(parts):
            tensors = (list(value.exp_avg.values()) + list(value.exp_avg_sq.values())
                       if isinstance(value, AdamWState) else list(value.values()))
            for t in tensors:
                x = t if torch.is_tensor(t) else torch.from_numpy(np.array(t))
                total += x.numel() * x.element_size()
                x.to(torch.float32)
        return total, time.perf_counter() - t0


def snapshot_parts(config: dict[str, Any], seed: int = 0) -> list[Any]:
    """A snapshot as the trainers ship it by default (``d3ray.train.scheduling.snapshot``, bfloat16, each state dict
    packed into one buffer): the state dict (a tied lm_head twice) and an :class:`AdamWState` with m, v of
    the parameters' shapes."""
    import torch

    from d3ray.influence.optimizer import AdamWState
    from d3ray.model import ModelConfig, build_model
    from d3ray.train.scheduling.snapshot import ship_optimizer_state, ship_state

    torch.manual_seed(seed)
    model = build_model(config, ModelConfig())
    moments = {k: v.detach().clone() for k, v in model.named_parameters()}
    state = AdamWState(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, step=1, exp_avg=moments,
                       exp_avg_sq={k: v.abs() for k, v in moments.items()})
    return [ship_state(model.state_dict(), "bfloat16"), ship_optimizer_state(state, "bfloat16")]


def time_snapshot(parts: list[dict[str, np.ndarray]], repeats: int) -> SnapshotTiming:
    """Least put and get seconds of ``parts`` on a local Ray started here (and shut down after)."""
    import ray

    from d3ray.run.cluster import init_local_ray

    owns = not ray.is_initialized()
    if owns:
        init_local_ray(num_cpus=2, log_to_driver=False)
    try:
        reader = ray.remote(SnapshotReader).options(num_cpus=0).remote()
        ray.get(reader.read.remote([ray.put({"x": np.zeros(1, np.float16)})]))  # actor started
        puts, gets, nbytes = [], [], 0
        for _ in range(repeats):
            t0 = time.perf_counter()
            refs = [ray.put(p) for p in parts]
            puts.append(time.perf_counter() - t0)
            nbytes, get_sec = ray.get(reader.read.remote(refs))  # refs in a list: not resolved by Ray
            gets.append(get_sec)
            del refs
        ray.kill(reader)
    finally:
        if owns:
            ray.shutdown()
    return SnapshotTiming(bytes=nbytes, put_sec=min(puts), get_sec=min(gets))


# ---- all-reduce ---------------------------------------------------------------------------------------
def _allreduce_worker(rank: int, world: int, port: int, sizes: list[int], repeats: int, queue: Any) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    out = {}
    for n in sizes:
        x = torch.ones(n)
        times = []
        for _ in range(repeats + 3):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(x)
            times.append(time.perf_counter() - t0)
        out[n] = min(times[3:])
    dist.destroy_process_group()
    if rank == 0:
        queue.put(out)


def time_allreduce(sizes: list[int], repeats: int, world: int = 2) -> AllReduceTiming:
    """All-reduce of each size (float32 numbers) over ``world`` spawned gloo processes on this host."""
    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    env = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"  # the children import torch with one thread each
    try:
        mp.start_processes(_allreduce_worker, args=(world, port, sizes, repeats, queue), nprocs=world,
                           start_method="spawn", join=True)
    finally:
        if env is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = env
    return AllReduceTiming(world_size=world, sec_by_floats=queue.get())
