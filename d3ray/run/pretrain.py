"""The training driver (pre-training and SFT): data preparation, the schedule coordinator, the fit.

    prepare_data  ── corpus or SFT suite (generated if none configured) · tokenizer (trained once
                     per run, reused on resume) · eval sets and eval tasks (prepare.py)
    requests      ── what the scheduler asks of the trainers (schedule.trainer_requests(), built once):
                     to the coordinator (what to wait for) and to the trainers (d3ray/train/scheduling/trainer_side.py)
    pre-run       ── the scheduler's before_run (a no-op but for DoReMi's reference, RegMix's proxies)
    coordinator   ── ScheduleCoordinator actor over the Ray Data stream
    fit           ── TorchTrainer(train_loop_per_worker) with N DeepSpeed workers; re-running the
                     same run name with the same config resumes from the newest checkpoint (Ray Train
                     storage); another config is refused first, a finished run returns its metrics (rerun.py)
    summary       ── final_metrics.json, placement.json and the closing table (summary.py)

The driver imports the worker (``d3ray.train.loop.train_loop_per_worker``, which Ray Train ships to the
workers by reference), never the reverse.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from functools import partial
from typing import Any

import yaml

from d3ray.config import RunConfig
from d3ray.config_loading import to_dict
from d3ray.errors import UserError
from d3ray.run.cluster import (
    size_tokenizers,
    start_autoscaling_coordinator,
    start_ray,
    wait_for_autoscaling_coordinator,
    worker_env,
)
from d3ray.run.preflight import check_cluster, check_environment
from d3ray.run.prepare import load_eval_sets, prepare_data, prepare_eval_tasks
from d3ray.run.rerun import check_rerun
from d3ray.run.summary import print_summary, schedule_summary, write_placement
from d3ray.run_files import (
    FINAL_METRICS,
    log_to_file,
    new_directories,
    remove_new_run_dir,
    stderr_to_file,
    stop_logging_to_file,
)
from d3ray.train.latest import latest_pointer_callback

logger = logging.getLogger(__name__)


def run_pretrain(cfg: RunConfig, callbacks: list[Any] | None = None) -> dict[str, Any]:
    """Train ``cfg`` to completion (resuming if the run directory has checkpoints); final metrics.

    ``callbacks`` are Ray Train ``UserCallback``s passed to ``ray.train.RunConfig(callbacks=...)``,
    e.g. the sweep's Tune report callback, which forwards each checkpointed report to Tune.
    """
    # Workers run in other directories: hand them an absolute run directory.
    cfg = dataclasses.replace(cfg, output_dir=str(cfg.run_dir.parent))
    finished = check_rerun(cfg.run_dir, cfg, cfg.train.stop_at_step or cfg.train.steps)
    if finished is not None:  # the same run, done: its files stay as they are
        print(f"run {cfg.name} is finished ({finished['steps']} steps, in {cfg.run_dir}): nothing to train; "
              "a new run needs --name=NEW", flush=True)
        return finished
    made = new_directories(cfg.run_dir)
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    driver_log = log_to_file(cfg.run_dir, "driver")
    started = time.time()
    try:
        return _run_pretrain(cfg, callbacks)
    except UserError:  # a run that failed on its data leaves no tokenizer for the fixed rerun to reuse
        from d3ray.data.tokenizer import discard_fresh_tokenizer

        discard_fresh_tokenizer(cfg.run_dir, since=started)
        stop_logging_to_file(driver_log)
        remove_new_run_dir(made)  # a rejected run leaves no folder that looks like a run (if it made it)
        raise
    finally:
        stop_logging_to_file(driver_log)


def _run_pretrain(cfg: RunConfig, callbacks: Any) -> dict[str, Any]:
    import ray
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from d3ray.data.chunk_stream import build_chunk_stream
    from d3ray.data.chunker import total_chunks
    from d3ray.model import model_config_dict
    from d3ray.schedule.coordinator import ScheduleCoordinator
    from d3ray.schedule.scheduler import BuildContext
    from d3ray.train.deepspeed_config import check_deepspeed_fragment
    from d3ray.train.loop import WorkerSpec, train_loop_per_worker

    started = time.perf_counter()
    run_dir = cfg.run_dir
    (run_dir / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    print(f"run {cfg.name}: {cfg.schedule.type_name} schedule, {cfg.train.steps} steps, in {run_dir} "
          f"(config.yaml, metrics.csv, logs/)", flush=True)
    logger.info("config:\n%s", yaml.safe_dump(to_dict(cfg), sort_keys=False))
    # Data first: a wrong path, a missing filesystem or a bad corpus is reported before Ray starts.
    check_environment(cfg)
    check_deepspeed_fragment(cfg.train)  # train.deepspeed's ZeRO keys, by DeepSpeed's own schema
    prepared = prepare_data(cfg)
    if prepared.domains_line:
        print(prepared.domains_line, flush=True)
    model_config = model_config_dict(cfg.model, prepared.vocab_size, prepared.data.seq_len, prepared.eos_id)
    eval_sets = load_eval_sets(cfg, prepared)
    eval_tasks = prepare_eval_tasks(prepared)
    schedule = cfg.schedule
    requests = schedule.trainer_requests()  # checked against cfg.train when the config was built (check_train)
    mix_domains = None
    if schedule.draws_mixture:  # a mixer: its domains and weights checked against the corpus before Ray starts
        from d3ray.schedule.mix.domains import resolve_mix_domains

        mix_domains = resolve_mix_domains(schedule, prepared.data, prepared.train_shards, prepared.sft)
        print(f"mixing {len(mix_domains)} domains: {', '.join(mix_domains)}", flush=True)
    env = worker_env(cfg)
    owns_ray = start_ray(cfg.ray, env)
    scheduler = None
    try:
        check_cluster(cfg, fixed=owns_ray and cfg.ray.address in (None, "local"))
        autoscaler_up = start_autoscaling_coordinator()  # Ray Train's, warm before the fit (d3ray/run/cluster.py)
        # DoReMi's reference model, RegMix's proxy runs: short runs of their own, first (a no-op for the rest)
        schedule.before_run(pre_run_context(cfg, prepared, list(mix_domains or [])))
        eval_ref = [ray.put(eval_sets)] if eval_sets else []
        scheduler = schedule.build_transformed(BuildContext(
            seed=cfg.seed, model_config=model_config, model=cfg.model, run_name=cfg.name, run_dir=str(run_dir),
            batch_size=cfg.train.global_batch_size, total_chunks=total_chunks(cfg.train.steps, schedule.L),
            tokenizer_dir=str(prepared.tokenizer_dir), eval_sets=eval_ref or None, domains=mix_domains))
        data = size_tokenizers(cfg, prepared.data, ray.cluster_resources().get("CPU", 0.0))  # tokenize_actors=0
        make_stream = partial(build_chunk_stream, prepared.train_shards, data, str(prepared.tokenizer_dir),
                              cfg.train.global_batch_size, schedule.window_batches(), schedule.shuffle_buffer,
                              cfg.seed, prepared.sft)
        # The coordinator lives on the driver's node: it owns the chunk batches in the object store.
        here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
        # Its arguments hold the scheduler's actor handles, which this driver keeps alive for the run: Ray's
        # E-level warning about restarts with such arguments (ray-project/ray#53727) goes to the driver log.
        with stderr_to_file(run_dir / "logs" / "driver.log"):
            coordinator = ray.remote(ScheduleCoordinator).options(
                num_cpus=0, max_concurrency=32, max_restarts=2, max_task_retries=2, scheduling_strategy=here,
            ).remote(make_stream, scheduler, requests, schedule.prefetch_chunks, schedule.staleness, schedule.deadline_s,
                     str(run_dir), draws_mixture=schedule.draws_mixture)
        # Every version of the weights, 0 included, comes from the trainers (d3ray/train/scheduling/trainer_side.py).
        spec = WorkerSpec(train=cfg.train, model=cfg.model, seed=cfg.seed, run_name=cfg.name, run_dir=run_dir,
                          run_config=to_dict(cfg), model_config=model_config, coordinator=coordinator,
                          eval_sets=eval_ref, tokenizer_dir=str(prepared.tokenizer_dir), requests=requests,
                          eval_tasks=[ray.put(eval_tasks)] if eval_tasks else [])
        trainer = TorchTrainer(
            train_loop_per_worker,
            train_loop_config={"spec": spec},
            # gloo for CPU tensors as well on GPU: a CPU tensor in an NCCL-only group fails (train/collectives.py)
            torch_config=TorchConfig(backend="cpu:gloo,cuda:nccl" if cfg.train.use_gpu else "gloo"),
            scaling_config=trainer_scaling_config(cfg.train),
            run_config=ray.train.RunConfig(
                name=cfg.name,
                storage_path=cfg.storage_path or str(run_dir.parent),
                failure_config=ray.train.FailureConfig(max_failures=cfg.train.max_failures),
                checkpoint_config=ray.train.CheckpointConfig(num_to_keep=cfg.train.keep_checkpoints),
                worker_runtime_env={"env_vars": env},
                callbacks=[latest_pointer_callback(), *(callbacks or [])],  # <run>/latest: newest persisted
                logging_config=ray.train.LoggingConfig(log_level="WARNING"),  # Ray Train's INFO: its log files
            ),
        )
        wait_for_autoscaling_coordinator(autoscaler_up)
        try:
            result = trainer.fit()
        except Exception:
            raise_user_error(coordinator)
            raise
        raise_user_error(coordinator)  # the trainers stopped early on bad data
        write_placement(run_dir, coordinator, scheduler)
        final = dict(result.return_value or {})
        report = ray.get(coordinator.report.remote())
        (run_dir / "data_quality.json").write_text(json.dumps(report, indent=2))
        final["wall_seconds"] = time.perf_counter() - started
        final["run_dir"] = str(run_dir)
        final["checkpoint"] = result.checkpoint.path if result.checkpoint else None
        final.update(schedule_summary(run_dir))
        (run_dir / FINAL_METRICS).write_text(json.dumps(final, indent=2))
        print_summary(final, report)
        ray.kill(coordinator)
        check_records_read(report, cfg, prepared)  # the bad fraction of all the run read, however few
        return final
    finally:
        if scheduler is not None:
            scheduler.close()
        if owns_ray:
            ray.shutdown()


def trainer_resources(train: Any) -> dict[str, float]:
    """What one trainer rank reserves: ``train.cpus_per_worker`` CPUs, ``train.resources_per_worker`` and,
    on GPUs, a ``train.gpus_per_worker`` share (TrainConfig refuses shares that would put two ranks on one
    GPU; tests/integration/test_fake_gpu_placement.py checks the placement on a fake-GPU cluster)."""
    resources = {"CPU": train.cpus_per_worker, **train.resources_per_worker}
    if train.use_gpu:
        resources["GPU"] = train.gpus_per_worker
    return resources


def trainer_scaling_config(train: Any) -> Any:
    """Ray Train's ``ScalingConfig`` of the trainers of ``train`` (a :class:`~d3ray.train.config.TrainConfig`)."""
    import ray.train

    return ray.train.ScalingConfig(num_workers=train.num_workers, use_gpu=train.use_gpu,
                                   resources_per_worker=trainer_resources(train))


def pre_run_context(cfg: RunConfig, prepared: Any, domains: list[str]) -> Any:
    """What a mixer's pre-runs (DoReMi's reference run, RegMix's proxies: run directories of their own)
    start from: the main run's data as the driver resolved it, its tokenizer, and in SFT its training
    files, held-out files and eval tasks (the generated suite's paths), so they train and evaluate on the
    same tasks."""
    from d3ray.export.write import export_model
    from d3ray.schedule.mix.prerun import PreRunContext

    data = dataclasses.replace(prepared.data, tokenizer=dataclasses.replace(
        prepared.data.tokenizer, path=str(prepared.tokenizer_dir)))
    # pre-runs train from scratch, never from a compare trunk's branch point (train.init_checkpoint)
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, init_checkpoint=None, stop_at_step=0))
    if prepared.sft is not None:
        cfg = dataclasses.replace(cfg, sft=prepared.sft, eval=dataclasses.replace(
            cfg.eval, sft_paths=list(prepared.sft_eval_paths), tasks=prepared.eval_tasks))
    return PreRunContext(cfg=cfg, data=data, domains=domains, run=run_pretrain, export=export_model)


def check_records_read(report: dict[str, Any], cfg: RunConfig, prepared: Any) -> None:
    """The bad-record limit (``data.max_bad_fraction``, SFT: ``sft.max_bad_fraction``) on every record the run
    read, checked at its end: a corpus smaller than ``min_records_before_check`` is checked too."""
    from d3ray.data.ledger import check_ledger

    if report.get("data_quality"):
        limit, field = ((prepared.sft.max_bad_fraction, "sft.max_bad_fraction") if prepared.sft is not None
                        else (prepared.data.max_bad_fraction, "data.max_bad_fraction"))
        check_ledger(report["data_quality"], limit, field)


def raise_user_error(coordinator: Any) -> None:
    """Re-raise the coordinator's user error (e.g. too many bad records), if it stopped on one."""
    import ray

    cause = ray.get(coordinator.error.remote())
    if isinstance(cause, UserError):
        raise cause from None
