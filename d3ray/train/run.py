"""The pre-training driver: data preparation, the schedule coordinator, and the Ray Train fit.

    prepare_data  ── sample corpus (if none configured) · shard listing · tokenizer (trained once
                     per run, reused on resume) · eval sets (ray.put once)
    coordinator   ── ScheduleCoordinator actor over the Ray Data stream
    fit           ── TorchTrainer(train_loop_per_worker) with N DeepSpeed workers; re-running the
                     same run name resumes from the newest checkpoint (Ray Train storage)
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from d3ray.config import RayClusterConfig, RunConfig
from d3ray.config_loading import to_dict
from d3ray.data.config import DataConfig
from d3ray.schedule.chunker import ChunkStream

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PreparedData:
    """The run's resolved data: shards, tokenizer and model vocabulary."""

    data: DataConfig
    train_shards: list[Any]
    validation_shards: list[Any]
    tokenizer_dir: Path
    vocab_size: int
    eos_id: int


def worker_env(cfg: RunConfig) -> dict[str, str]:
    """Environment for Ray Train workers and actors (DeepSpeed on CPU, quiet Ray Data)."""
    env = {
        "RAY_DATA_DISABLE_PROGRESS_BARS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": str(cfg.ray.health_check_interval_s),
        "RAY_TRAIN_ENABLE_PRINT_PATCH": "0",  # progress lines are printed once, not print + log
    }
    if not cfg.train.use_gpu:
        env["DS_ACCELERATOR"] = "cpu"
    return env


def start_ray(ray_cfg: RayClusterConfig, env: dict[str, str]) -> bool:
    """Connect to or start Ray; returns True if this call started it (so the caller shuts it down)."""
    import ray

    os.environ.update(env)  # a local instance's raylet (and so every actor) inherits these
    if ray.is_initialized():
        return False
    if ray_cfg.address not in (None, "local"):
        ray.init(address=ray_cfg.address)
        return True
    num_cpus = ray_cfg.num_cpus or max(4, os.cpu_count() or 1)
    ray.init(num_cpus=num_cpus, log_to_driver=True)
    return True


def prepare_data(cfg: RunConfig) -> PreparedData:
    """Resolve shards (generating the sample corpus if none are configured) and the tokenizer."""
    from d3ray.data.sample import write_sample_corpus
    from d3ray.data.shards import list_shards
    from d3ray.data.tokenizer import ensure_tokenizer, load_tokenizer

    data = cfg.data
    if not data.train_paths:
        sample_dir = cfg.run_dir / "sample_data"
        if not (sample_dir / "train").exists():
            logger.info("no data.train_paths configured: generating the sample corpus in %s", sample_dir)
            write_sample_corpus(sample_dir, seed=cfg.seed)
        data = dataclasses.replace(
            data,
            train_paths=[str(sample_dir / "train")],
            validation_paths=list(data.validation_paths) or [str(sample_dir / "validation")],
        )
    train_shards = list_shards(data.train_paths)
    validation_shards = list_shards(data.validation_paths) if data.validation_paths else []
    tokenizer_dir = Path(ensure_tokenizer(data, train_shards, cfg.run_dir))
    tokenizer = load_tokenizer(tokenizer_dir)
    eos_id = tokenizer.eos_token_id
    return PreparedData(data, train_shards, validation_shards, tokenizer_dir, len(tokenizer), eos_id)


def build_chunk_stream(
    shards: list[Any], data: DataConfig, tokenizer_dir: str, batch_size: int, chunk_len: int,
    shuffle_buffer: int, seed: int,
) -> ChunkStream:
    """The run's deterministic chunk stream over Ray Data (built inside the coordinator actor)."""
    from d3ray.data.pipeline import iter_packed_sequences
    from d3ray.data.records import BadRecordLedger

    ledger = BadRecordLedger()

    def sequences_for_epoch(epoch: int):
        return iter_packed_sequences(shards, data, tokenizer_dir, ledger)

    return ChunkStream(sequences_for_epoch, batch_size, chunk_len, shuffle_buffer, seed, ledger=ledger)


def load_eval_sets(cfg: RunConfig, prepared: PreparedData) -> dict[str, Any]:
    """Per-domain validation sequences plus ``ood:<file>`` sets, as (n, T) int32 arrays."""
    from d3ray.data.evaluation import load_eval_sequences, load_text_file_sequences

    sets: dict[str, Any] = {}
    if prepared.data.validation_paths:
        sets.update(load_eval_sequences(prepared.data.validation_paths, prepared.data, prepared.tokenizer_dir,
                                        cfg.eval.max_sequences_per_domain))
    for path in cfg.eval.ood_text_paths:
        name = f"ood:{Path(path).stem}"
        sets[name] = load_text_file_sequences(path, prepared.tokenizer_dir, prepared.data.seq_len,
                                              cfg.eval.max_ood_sequences)
    return sets


def run_pretrain(cfg: RunConfig, scheduler_resources: dict[str, Any] | None = None,
                 callbacks: list[Any] | None = None) -> dict[str, Any]:
    """Train ``cfg`` to completion (resuming if the run directory has checkpoints); final metrics.

    ``callbacks`` are Ray Train ``UserCallback``s passed to ``ray.train.RunConfig(callbacks=...)``,
    e.g. the sweep's Tune report callback, which forwards each checkpointed report to Tune.
    """
    import ray
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from d3ray.model import model_config_dict
    from d3ray.schedule.coordinator import ScheduleCoordinator
    from d3ray.schedule.scheduler import build_scheduler
    from d3ray.train.loop import WorkerSpec, train_loop_per_worker

    started = time.perf_counter()
    # Workers run in other directories: hand them an absolute run directory.
    cfg = dataclasses.replace(cfg, output_dir=str(cfg.run_dir.parent))
    env = worker_env(cfg)
    owns_ray = start_ray(cfg.ray, env)
    try:
        run_dir = cfg.run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
        logger.info("run %s in %s\n%s", cfg.name, run_dir, yaml.safe_dump(to_dict(cfg), sort_keys=False))
        prepared = prepare_data(cfg)
        model_config = model_config_dict(cfg.model, prepared.vocab_size, prepared.data.seq_len, prepared.eos_id)
        eval_sets = load_eval_sets(cfg, prepared)
        resources = dict(scheduler_resources or {})
        resources.update(model_config=model_config, run_config=cfg)
        scheduler = build_scheduler(cfg.schedule, cfg.seed, **resources)
        make_stream = partial(build_chunk_stream, prepared.train_shards, prepared.data, str(prepared.tokenizer_dir),
                              cfg.train.global_batch_size, cfg.schedule.L, cfg.schedule.shuffle_buffer, cfg.seed)
        # The coordinator lives on the driver's node: it owns the chunk batches in the object store.
        here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
        coordinator = ray.remote(ScheduleCoordinator).options(
            num_cpus=0, max_concurrency=32, max_restarts=2, max_task_retries=2, scheduling_strategy=here,
        ).remote(make_stream, scheduler, cfg.schedule.prefetch_chunks,
                 getattr(cfg.schedule, "staleness", 1), getattr(cfg.schedule, "deadline_s", None))
        if getattr(scheduler, "needs_weights", False) and not any(run_dir.glob("checkpoint_*")):
            publish_initial_weights(cfg, model_config, coordinator,
                                    bool(getattr(scheduler, "needs_optimizer_state", False)))
        spec = WorkerSpec(cfg=cfg, model_config=model_config, coordinator=coordinator,
                          eval_sets=[ray.put(eval_sets)] if eval_sets else [],
                          tokenizer_dir=str(prepared.tokenizer_dir),
                          publish_weights=bool(getattr(scheduler, "needs_weights", False)),
                          publish_optimizer_state=bool(getattr(scheduler, "needs_optimizer_state", False)))
        resources_per_worker = {"CPU": cfg.train.cpus_per_worker, **cfg.train.resources_per_worker}
        if cfg.train.use_gpu:
            resources_per_worker["GPU"] = cfg.train.gpus_per_worker
        trainer = TorchTrainer(
            train_loop_per_worker,
            train_loop_config={"spec": spec},
            torch_config=TorchConfig(backend="nccl" if cfg.train.use_gpu else "gloo"),
            scaling_config=ray.train.ScalingConfig(num_workers=cfg.train.num_workers, use_gpu=cfg.train.use_gpu,
                                                   resources_per_worker=resources_per_worker),
            run_config=ray.train.RunConfig(
                name=cfg.name,
                storage_path=cfg.storage_path or str(run_dir.parent),
                failure_config=ray.train.FailureConfig(max_failures=cfg.train.max_failures),
                checkpoint_config=ray.train.CheckpointConfig(num_to_keep=cfg.train.keep_checkpoints),
                worker_runtime_env={"env_vars": env},
                callbacks=list(callbacks or []),
            ),
        )
        result = trainer.fit()
        write_placement(run_dir, coordinator, scheduler)
        final = dict(result.return_value or {})
        report = ray.get(coordinator.report.remote())
        (run_dir / "data_quality.json").write_text(json.dumps(report, indent=2))
        final["wall_seconds"] = time.perf_counter() - started
        final["run_dir"] = str(run_dir)
        final["checkpoint"] = result.checkpoint.path if result.checkpoint else None
        (run_dir / "final_metrics.json").write_text(json.dumps(final, indent=2))
        print_summary(final, report)
        ray.kill(coordinator)
        return final
    finally:
        if owns_ray:
            ray.shutdown()


def publish_initial_weights(cfg: RunConfig, model_config: dict[str, Any], coordinator: Any,
                            optimizer_state: bool = False) -> None:
    """Publish the initial weights (version 0) from the driver, so that chunk 0's influence overlaps
    with the trainers' start-up. They equal the trainers' own: same seed, same construction; with
    ``optimizer_state``, also the AdamW state before the first step (zeros, the first step's lr)."""
    import ray
    import torch

    from d3ray.model import build_model
    from d3ray.train.deepspeed_config import lr_factor
    from d3ray.train.snapshot import initial_optimizer_state

    torch.manual_seed(cfg.seed)
    model = build_model(model_config, cfg.model)
    parts: list[Any] = [{k: v.detach().float().cpu().numpy() for k, v in model.state_dict().items()}]
    if optimizer_state:
        tcfg = cfg.train
        parts.append(initial_optimizer_state(model, tcfg.lr * lr_factor(0, tcfg), tcfg.betas, tcfg.weight_decay,
                                             tcfg.grad_clip))
    ray.get(coordinator.publish_weights.remote(0, [ray.put(p) for p in parts]))


def write_placement(run_dir: Path, coordinator: Any, scheduler: Any) -> None:
    """``placement.json``: the node id of the coordinator and of each influence and solver actor, and
    the influence actors' OS niceness (``schedule.influence_nice``)."""
    import ray

    def ask(actor: Any, fn: Any) -> Any:
        """``fn()`` evaluated inside the actor's process; a dead actor gives the reason instead."""
        try:
            return ray.get(actor.__ray_call__.remote(lambda self: fn()), timeout=30)
        except Exception as err:
            return f"unavailable: {type(err).__name__}"

    def node_of(actor: Any) -> str:
        return ask(actor, lambda: ray.get_runtime_context().get_node_id())

    influence = getattr(scheduler, "influence_actors", [])
    placement = {
        "driver": ray.get_runtime_context().get_node_id(),
        "coordinator": node_of(coordinator),
        "influence": [node_of(a) for a in influence],
        "influence_nice": [ask(a, lambda: os.nice(0)) for a in influence],
        "solver": [node_of(a) for a in getattr(getattr(scheduler, "solver_pool", None), "actors", [])],
    }
    (run_dir / "placement.json").write_text(json.dumps(placement, indent=2))


def print_summary(final: dict[str, Any], report: dict[str, Any]) -> None:
    """Per-domain perplexities and the data-quality counts, as a small table."""
    print(f"\nfinished {final.get('steps')} steps, final train loss {final.get('final_loss', float('nan')):.4f}, "
          f"{final.get('tokens_per_sec', 0):.0f} tok/s, wall {final.get('wall_seconds', 0):.1f}s")
    rows = sorted(k for k in final if k.startswith("eval/") and k.endswith("/ppl"))
    if rows:
        print(f"{'eval set':<32} {'loss':>8} {'ppl':>10}")
        for key in rows:
            name = key[len("eval/"):-len("/ppl")]
            print(f"{name:<32} {final[f'eval/{name}/loss']:>8.4f} {final[key]:>10.2f}")
    quality = report.get("data_quality") or {}
    if quality:
        print(f"data: {quality.get('total_good', '?')} good records, {quality.get('total_bad', '?')} bad "
              f"({quality.get('bad_by_reason', {})}); dropped tail sequences: {report.get('dropped_tail_sequences', 0)}")
