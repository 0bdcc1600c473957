"""The per-worker training loop: one linear function, run by every Ray Train worker.

    resume (DeepSpeed state, RNG, data cursor, schedule state)
    trainer_side.start: what the scheduler asked of the trainers for the first chunks (version 0: its
        weights snapshot or sketches, published by the trainers themselves)
    for each decided chunk:
        for each batch in the chunk's training order: train_step (this rank's rows → micro-batches →
            optimizer step; per-sequence losses, weighted by the decision's weights or in-step rule)
        trainer_side.chunk_trained: feedback (the chunk's per-sample losses), then the next version's
            snapshot or sketches (d3ray/train/trainer_side.py)
        checkpoint every N chunks (trainer_side.save: the sketcher's state with it)

Every rank pulls the same ``DecidedChunk`` from the ScheduleCoordinator and takes its contiguous
share of each global batch (rows ``rank*B/W .. (rank+1)*B/W``); micro-batches are the rows
``[k·m, (k+1)·m)`` of the global batch whatever the number of workers, so the data seen and the
per-micro-batch loss weights do not depend on it, and every rank runs the same number of steps.
"""

from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from d3ray.config import RunConfig
from d3ray.schedule.scheduler import TrainerRequests

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs, passed through ``train_loop_config`` (no globals)."""

    cfg: RunConfig
    model_config: dict[str, Any]
    coordinator: Any
    eval_sets: list[Any]
    """[ObjectRef of dict name → (n, T) int32], list-wrapped so Ray does not resolve it early."""
    tokenizer_dir: str
    requests: TrainerRequests
    """What the scheduler asks of the trainers (snapshots, sketches, feedback; d3ray/train/trainer_side.py)."""
    eval_tasks: list[Any]
    """[ObjectRef of the prepared lm-eval tasks] (``eval.tasks``), or []."""


def micro_weights(chunk, position: int, rows: slice, losses):
    """The loss weights of one micro-batch, on the losses' device: the decision's per-sample weights,
    or the in-step rule applied to the micro-batch's own (detached) per-sequence losses (a tensor, kept
    on the device: no copy to the host); None = unweighted."""
    import torch

    if chunk.sample_weights is not None:
        return torch.as_tensor(np.asarray(chunk.sample_weights[position][rows], dtype=np.float64),
                               device=losses.device)
    if chunk.loss_weighting is not None:
        from d3ray.schedule.weight.loss_reweight import loss_weights

        rule = chunk.loss_weighting
        return loss_weights(losses, rule.strategy, **rule.params)
    return None


def train_step(engine, batch, rows: slice, micro: int, device, weights_for) -> Any:
    """One optimizer step of ``engine`` on the rows ``rows`` of the global batch ``batch`` (this rank's
    share), in micro-batches of ``micro`` rows (the rows ``[k·micro, (k+1)·micro)`` from ``rows.start``):
    per-sequence losses, the step loss (``weights_for(global_rows, losses)`` gives a micro-batch's loss
    weights or None, see :func:`micro_weights`), ``engine.backward`` and ``engine.step`` per micro-batch
    (DeepSpeed steps the optimizer at the accumulation boundary). Shared by the training loop and the
    census (d3ray/census/), whose one-rank engine takes every row of the batch with the run's accumulation.

    Returns:
        (1 + n_rows,) float32 on ``device``: the mean of the micro-batch losses, then each row's token-mean loss.
    """
    import torch

    from d3ray.data.labels import batch_width, lm_labels
    from d3ray.lm_loss import sequence_losses, step_loss

    n_rows = rows.stop - rows.start
    labels_all = torch.as_tensor(lm_labels(batch.input_ids[rows], batch.n_tokens[rows],
                                           None if batch.loss_mask is None else batch.loss_mask[rows]))
    ids_all = torch.as_tensor(np.asarray(batch.input_ids[rows], dtype=np.int64))
    # Per-sample losses and the step loss stay on the device until the one copy to the host per
    # step (weighted or not, the same path: the weights are computed on the device too).
    step_stats = torch.zeros(1 + n_rows, dtype=torch.float32, device=device)
    n_mine = np.asarray(batch.n_tokens[rows])
    for m in range(0, n_rows, micro):
        width = batch_width(n_mine[m:m + micro])  # padded SFT rows: drop the padding columns
        ids = ids_all[m:m + micro, :width].to(device)
        labels = labels_all[m:m + micro, :width].to(device)
        sums, counts = sequence_losses(engine(input_ids=ids).logits, labels)
        seq_loss = (sums / counts.clamp(min=1.0)).detach()
        step_stats[1 + m:1 + m + len(ids)] = seq_loss
        first = rows.start + m
        loss = step_loss(sums, counts, weights_for(slice(first, first + len(ids)), seq_loss))
        engine.backward(loss)
        engine.step()
        step_stats[0] += loss.detach()
    step_stats[0] /= -(-n_rows // micro)  # the mean of the micro-batch losses
    return step_stats


def all_ranks(step_stats, world: int) -> np.ndarray:
    """Every rank's ``train_step`` result on every rank: (W, 1 + B/W), rank-major (one small collective)."""
    import torch
    import torch.distributed as dist

    from d3ray.train.collectives import collective_device

    if world == 1:
        return step_stats.cpu().numpy()[None]
    step_stats = step_stats.to(collective_device())
    gathered = [torch.zeros_like(step_stats) for _ in range(world)]
    dist.all_gather(gathered, step_stats)
    return torch.stack(gathered).cpu().numpy()


def harness_metrics(engine, tasks: list[Any], tokenizer_dir: str, rank: int, zero_stage: int) -> dict[str, float]:
    """``eval.tasks`` through lm-evaluation-harness on rank 0 (the other ranks wait; under ZeRO-3 every
    rank takes part in gathering the full parameters first)."""
    import contextlib

    import torch.distributed as dist

    from d3ray.data.tokenizer import load_tokenizer
    from d3ray.deepspeed_import import import_deepspeed
    from d3ray.eval.harness import run_eval_tasks

    deepspeed = import_deepspeed()
    gather = (deepspeed.zero.GatheredParameters(list(engine.module.parameters())) if zero_stage == 3
              else contextlib.nullcontext())
    metrics: dict[str, float] = {}
    with gather:
        if rank == 0:
            metrics = run_eval_tasks(engine.module, load_tokenizer(tokenizer_dir), tasks)
        if dist.is_initialized():
            dist.barrier()
    return metrics


def train_loop_per_worker(config: dict[str, Any]) -> dict[str, Any]:
    """Ray Train entry point; returns rank 0's final metrics (→ ``Result.return_value``)."""
    import ray
    import ray.train
    import torch
    import torch.distributed as dist

    from d3ray import faults
    from d3ray.config_loading import to_dict
    from d3ray.deepspeed_import import import_deepspeed
    from d3ray.errors import UserError
    from d3ray.model import build_model, enable_activation_checkpointing, lora_base_model
    from d3ray.run_files import route_logs_to_run_dir, stdout_to_log
    from d3ray.train.checkpoint import TrainState, checkpoint_due, load_checkpoint, save_checkpoint
    from d3ray.train.deepspeed_config import deepspeed_config, lr_factor
    from d3ray.train.evaluation import evaluate
    from d3ray.train.metrics import RunLogs, chunk_domain_metrics, progress_line
    from d3ray.train.trainer_side import TrainerSide

    deepspeed = import_deepspeed()
    spec: WorkerSpec = config["spec"]
    cfg, tcfg = spec.cfg, spec.cfg.train
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    is_rank0 = rank == 0
    route_logs_to_run_dir(cfg.run_dir, f"trainer-{rank}")
    if world != tcfg.num_workers:
        raise RuntimeError(f"expected {tcfg.num_workers} workers, Ray Train started {world}")
    with stdout_to_log(logger):  # DeepSpeed announces each op it loads with a print: the log file, not the console
        deepspeed.init_distributed(dist_backend="nccl" if tcfg.use_gpu else "gloo")
    device = torch.device("cuda", torch.cuda.current_device()) if tcfg.use_gpu else torch.device("cpu")

    torch.manual_seed(cfg.seed)
    ds_config = deepspeed_config(tcfg)
    model = build_model(spec.model_config, cfg.model, ds_config)  # ZeRO-3: built partitioned (zero.Init)
    if tcfg.zero_stage == 3:
        held = sum(p.ds_tensor.numel() for p in model.parameters())
        logger.info("rank %d built the model partitioned (ZeRO-3): holds %d of %d parameter values", rank, held,
                    sum(p.ds_numel for p in model.parameters()))
    if tcfg.activation_checkpointing:
        enable_activation_checkpointing(model)
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        model_parameters=[p for p in model.parameters() if p.requires_grad],
        config=ds_config,
        lr_scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, partial(lr_factor, cfg=tcfg)),
    )
    engine.train()  # from_pretrained returns a model in eval mode: train with the model's own dropout

    run_dir = cfg.run_dir
    coordinator = spec.coordinator
    trainer_side = TrainerSide(spec.requests, engine, rank, world, coordinator, tcfg.zero_stage, tcfg.steps, run_dir)
    frozen_base = lora_base_model(cfg.model)
    state = TrainState()
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None and tcfg.init_checkpoint:  # a branch of a shared trunk (d3ray compare)
        checkpoint = ray.train.Checkpoint.from_directory(tcfg.init_checkpoint)
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            state = load_checkpoint(engine, Path(d), rank, base_model=frozen_base)
            trainer_side.restore(Path(d))
        logger.info("rank %d resumed at step %d, chunk %d+%d", rank, state.step, state.next_chunk, state.position)
    if is_rank0 and state.schedule:
        ray.get(coordinator.restore.remote(state.schedule))

    logs = RunLogs(run_dir, state.step, state.next_chunk + (1 if state.position else 0), report_to=tcfg.report_to,
                   run_name=cfg.name, config=to_dict(cfg)) if is_rank0 else None
    eval_sets = ray.get(spec.eval_sets[0]) if spec.eval_sets else {}
    eval_tasks = ray.get(spec.eval_tasks[0]) if spec.eval_tasks else []
    per_rank = tcfg.global_batch_size // world
    micro = tcfg.micro_batch_size
    last_eval: dict[str, float] = {}

    trainer_side.start(state.next_chunk, state.step, logs)  # what the first chunks need (fresh start or resume)

    def run_eval() -> dict[str, float]:
        if not eval_sets and not eval_tasks:
            return {}
        result = evaluate(engine, eval_sets, rank, world, tcfg.micro_batch_size, device) if eval_sets else {}
        if eval_tasks:
            result.update(harness_metrics(engine, eval_tasks, spec.tokenizer_dir, rank, tcfg.zero_stage))
        if is_rank0:
            logs.log_metrics({"step": state.step, **result})
            summary = " ".join(f"{k.split('/')[1]}={v:.1f}" for k, v in result.items() if k.endswith("/ppl"))
            print(f"eval step {state.step} | mean loss {result.get('eval/mean_loss', float('nan')):.4f} | ppl {summary}",
                  flush=True)
        return result

    def timed_eval() -> dict[str, float]:
        """:func:`run_eval`, its seconds logged (``time/eval_sec``: part of the training loop's wall time)."""
        t_eval = time.perf_counter()
        result = run_eval()
        if is_rank0:
            logs.log_metrics({"step": state.step, "time/eval_sec": time.perf_counter() - t_eval})
        return result

    ready_s = ray.get(coordinator.scheduler_ready.remote())  # the scheduler's actors started, off the clock
    if is_rank0 and ready_s > 0.01:
        logs.log_metrics({"step": state.step, "time/scheduler_ready_sec": ready_s})
    start_time = time.perf_counter()
    last_checkpoint_time, last_checkpoint_step = start_time, state.step
    carried_wait = 0.0  # a checkpoint's wait for the next decision: counted as that chunk's wait
    upload = ray.train.CheckpointUploadMode[tcfg.checkpoint_upload.upper()]
    start_tokens = state.tokens
    loss_value = float("nan")
    next_ref = coordinator.get_chunk.remote(state.next_chunk)
    end = tcfg.stop_at_step or tcfg.steps  # a compare trunk stops early; its LR schedule is that of tcfg.steps
    while state.step < end:
        t_wait = time.perf_counter()
        try:
            chunk = ray.get(next_ref)
        except UserError as err:  # bad data found by the stream: the driver reports it in one line
            logger.error("stopping: %s", err)
            return {"steps": state.step, "stopped_by_user_error": True}
        wait_s = time.perf_counter() - t_wait + carried_wait
        carried_wait = 0.0
        next_ref = coordinator.get_chunk.remote(chunk.chunk_id + 1)  # prefetch the next decided chunk
        if is_rank0 and state.position == 0:
            logs.log_chunk(chunk, wait_s)
        chunk_losses = np.full((chunk.steps, tcfg.global_batch_size), np.nan, dtype=np.float32)
        first_position = state.position
        pending = chunk.batch_refs[first_position] if first_position < chunk.steps else None
        for p in range(first_position, chunk.steps):
            step_start = time.perf_counter()
            batch = ray.get(pending)
            pending = chunk.batch_refs[p + 1] if p + 1 < chunk.steps else None
            faults.inject(run_dir, "train_step", rank=rank, step=state.step)
            step_stats = train_step(engine, batch, slice(rank * per_rank, (rank + 1) * per_rank), micro, device,
                                    partial(micro_weights, chunk, p))
            stats = all_ranks(step_stats, world)  # (W, 1 + B/W): every rank's step loss and per-sample losses
            loss_value = float(stats[:, 0].sum()) / world
            chunk_losses[p] = stats[:, 1:].reshape(-1)
            state.step += 1
            state.position = p + 1
            state.tokens += int(batch.n_tokens.sum())
            if is_rank0:
                elapsed = time.perf_counter() - start_time
                tps = (state.tokens - start_tokens) / max(elapsed, 1e-9)
                lr = engine.get_lr()[0]
                grad_norm = engine.get_global_grad_norm()
                logs.log_samples(state.step, chunk.chunk_id, p, chunk.sample_ids[p], chunk.domains[p])
                logs.log_metrics({"step": state.step, "chunk_id": chunk.chunk_id, "train/loss": loss_value,
                                  "train/lr": lr, "train/grad_norm": float(grad_norm) if grad_norm is not None else None,
                                  "data/tokens": state.tokens, "data/tokens_per_sec": tps,
                                  "time/step_sec": time.perf_counter() - step_start,
                                  "time/wait_sec": wait_s if p == first_position else 0.0})
                if state.step % tcfg.log_every == 0 or state.step == tcfg.steps:
                    print(progress_line(state.step, tcfg.steps, loss_value, tps, lr, wait_s), flush=True)
            if tcfg.eval_every and state.step % tcfg.eval_every == 0 and state.step < end:
                last_eval = timed_eval()
            if state.step >= end:
                break
        chunk_done = state.position >= chunk.steps
        if chunk_done and is_rank0:
            # Per-domain training loss (and the mixer's weights) of the chunk: one metrics row per chunk.
            logs.log_metrics({"step": state.step, "chunk_id": chunk.chunk_id,
                              **chunk_domain_metrics([d for ds in chunk.domains for d in ds], chunk_losses,
                                                     chunk.mixture)})
        if chunk_done:  # feedback, then the next version's snapshot / sketches
            t_boundary = time.perf_counter()
            trainer_side.chunk_trained(chunk, chunk_losses, state.step, more=state.step < end)
            if is_rank0:
                logs.log_metrics({"step": state.step, "time/chunk_boundary_sec": time.perf_counter() - t_boundary})
            state.next_chunk, state.position = chunk.chunk_id + 1, 0
        finished = state.step >= end
        if finished:
            last_eval = timed_eval()
        due = checkpoint_due(finished=finished, chunk_done=chunk_done, next_chunk=state.next_chunk,
                             every_chunks=tcfg.checkpoint_every_chunks,
                             seconds_since_last=time.perf_counter() - last_checkpoint_time,
                             every_sec=tcfg.checkpoint_every_sec, every_steps=tcfg.checkpoint_every_steps,
                             step=state.step, last_checkpoint_step=last_checkpoint_step)
        if world > 1 and tcfg.checkpoint_every_sec > 0 and chunk_done and not finished:
            # The clocks of the ranks differ: rank 0's decision holds for all (save is a collective).
            flag = torch.tensor([float(due)], device=device)
            dist.broadcast(flag, src=0)
            due = bool(flag.item())
        if due:
            last_checkpoint_time, last_checkpoint_step = time.perf_counter(), state.step
            if is_rank0:
                if not finished:  # the next chunk's decision belongs in this checkpoint
                    t_wait = time.perf_counter()
                    ray.get(next_ref)
                    carried_wait = time.perf_counter() - t_wait
                state.schedule = ray.get(coordinator.checkpoint_state.remote(state.next_chunk))
            metrics = {"step": state.step, "train/loss": loss_value, "data/tokens": state.tokens,
                       "chunk_id": chunk.chunk_id, **{k: v for k, v in last_eval.items() if np.isfinite(v)}}
            # Ray Train removes the local copy once it is in storage_path; with the asynchronous upload the
            # next chunk trains while it copies (training only waits on a previous upload still running).
            t_save = time.perf_counter()
            local = tempfile.mkdtemp(prefix="d3ray-checkpoint-")
            save_checkpoint(engine, state, Path(local), rank, Path(spec.tokenizer_dir), base_model=frozen_base)
            trainer_side.save(Path(local))
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(local),
                             checkpoint_upload_mode=upload, delete_local_checkpoint_after_upload=True)
            if is_rank0:  # what the checkpoint cost the trainers (with async: the save, not the upload)
                logs.log_metrics({"step": state.step, "time/checkpoint_sec": time.perf_counter() - t_save})
            if is_rank0:
                coordinator.release.remote(state.next_chunk)

    elapsed = time.perf_counter() - start_time
    if is_rank0:
        logs.close()
    return {"steps": state.step, "final_loss": loss_value, "tokens": state.tokens,
            "tokens_per_sec": (state.tokens - start_tokens) / max(elapsed, 1e-9),
            "train_seconds": elapsed, **last_eval}
