"""The per-worker training loop: one linear function, run by every Ray Train worker.

    build: this rank's engine (engine.py, one TrainerRank), the trainer side of the scheduler
    restore (checkpointer.resume: DeepSpeed state, RNG, data cursor, schedule state)
    trainer_side.start: what the scheduler asked of the trainers for the first chunks (version 0: its
        weights snapshot or sketches, published by the trainers themselves)
    for each decided chunk:
        for each batch in the chunk's training order: train_step (this rank's rows → micro-batches →
            optimizer step; per-sequence losses, weighted by the decision's weights or in-step rule);
            the step's row and progress line (step_logger.py), an eval when due (evaluator.py)
        checkpointer.chunk_ended: is a checkpoint due? (if so rank 0 asks the coordinator for its state)
        trainer_side.chunk_trained: feedback (the chunk's per-sample losses), then the next version's
            snapshot or sketches (d3ray/train/scheduling/trainer_side.py)
        checkpointer.save_if_due (checkpointer.py: the cadence, the save, its cost)
        trainer_side.after_checkpoint: at staleness >= 1 the trainers' own scoring of the chunk after
            the next, or the snapshot D3's influence actors read for it (saved first: a save right after
            the scoring pass was slower, a report beside the actor's pass too)

Every rank pulls the same ``DecidedChunk`` from the ScheduleCoordinator and takes its contiguous
share of each global batch (rows ``rank*B/W .. (rank+1)*B/W``); micro-batches are the rows
``[k·m, (k+1)·m)`` of the global batch whatever the number of workers, so the data seen and the
per-micro-batch loss weights do not depend on it, and every rank runs the same number of steps.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from d3ray.model import ModelConfig
from d3ray.schedule.scheduler import TrainerRequests
from d3ray.train.config import TrainConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs, passed through ``train_loop_config`` (no globals): the train and model
    configs and the run's seed, name and directory the driver resolved, not the whole run config (the
    worker sits below it, d3ray/run/pretrain.py builds this)."""

    train: TrainConfig
    model: ModelConfig
    seed: int
    run_name: str
    run_dir: Path
    """Absolute: the workers run in other directories."""
    run_config: dict[str, Any]
    """The resolved run config as plain values (``to_dict``): what the trackers record as the run's config."""
    model_config: dict[str, Any]
    """The transformers config dict the driver resolved (vocabulary, context length)."""
    coordinator: Any
    eval_sets: list[Any]
    """[ObjectRef of dict name → (n, T) int32], list-wrapped so Ray does not resolve it early."""
    tokenizer_dir: str
    requests: TrainerRequests
    """What the scheduler asks of the trainers (snapshots, sketches, feedback; d3ray/train/scheduling/trainer_side.py)."""
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
    census (d3ray/lab/census/), whose one-rank engine takes every row of the batch with the run's accumulation.

    Returns:
        (1 + n_rows,) float32 on ``device``: the mean of the micro-batch losses, then each row's token-mean loss.
    """
    import torch

    from d3ray.data.labels import batch_width, lm_labels
    from d3ray.model.lm_loss import sequence_losses, step_loss

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


def train_loop_per_worker(config: dict[str, Any]) -> dict[str, Any]:
    """Ray Train entry point; returns rank 0's final metrics (→ ``Result.return_value``)."""
    import ray
    import ray.train

    from d3ray import faults
    from d3ray.errors import UserError
    from d3ray.model import lora_base_model
    from d3ray.run_files import route_logs_to_run_dir
    from d3ray.train.allocator import keep_freed_memory
    from d3ray.train.checkpointer import Checkpointer, resume
    from d3ray.train.engine import start_trainer_rank
    from d3ray.train.evaluator import Evaluator
    from d3ray.train.metrics import RunLogs
    from d3ray.train.scheduling.trainer_side import TrainerSide
    from d3ray.train.step_logger import StepLogger

    # ---- build: this rank, its engine, the trainer side of the scheduler --------------------------------
    spec: WorkerSpec = config["spec"]
    tcfg, coordinator, run_dir = spec.train, spec.coordinator, spec.run_dir
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    route_logs_to_run_dir(run_dir, f"trainer-{rank}")
    if tcfg.keep_freed_memory and not keep_freed_memory():
        logger.info("train.keep_freed_memory: no glibc mallopt in this process; the C library's own thresholds")
    if world != tcfg.num_workers:
        raise RuntimeError(f"expected {tcfg.num_workers} workers, Ray Train started {world}")
    trainer, device = start_trainer_rank(tcfg, spec.model, spec.seed, spec.model_config, rank, world)
    engine = trainer.engine
    trainer_side = TrainerSide(spec.requests, trainer, coordinator, tcfg.steps, run_dir)
    base_model = lora_base_model(spec.model)

    # ---- restore: engine, RNG, data cursor, schedule state ---------------------------------------------
    state = resume(trainer, tcfg, coordinator, trainer_side, base_model)
    logs = RunLogs(run_dir, state.step, state.next_chunk + (1 if state.position else 0), report_to=tcfg.report_to,
                   run_name=spec.run_name, config=spec.run_config) if trainer.is_rank0 else None
    evaluator = Evaluator(trainer, ray.get(spec.eval_sets[0]) if spec.eval_sets else {},
                          ray.get(spec.eval_tasks[0]) if spec.eval_tasks else [], spec.tokenizer_dir,
                          tcfg.micro_batch_size, device, tcfg.eval_every, logs)
    trainer_side.start(state.next_chunk, state.step, logs)  # what the first chunks need (fresh start or resume)
    steps_log = StepLogger(logs, tcfg.steps, tcfg.log_every, state)
    steps_log.scheduler_ready(state.step, ray.get(coordinator.scheduler_ready.remote()))  # the clock starts
    checkpointer = Checkpointer(trainer, tcfg, coordinator, trainer_side, spec.tokenizer_dir, base_model, device,
                                logs, state.step)

    # ---- train: each decided chunk, its steps, then its boundary --------------------------------------
    per_rank = tcfg.global_batch_size // world
    my_rows = slice(rank * per_rank, (rank + 1) * per_rank)
    loss_value = float("nan")
    next_ref = coordinator.get_chunk.remote(state.next_chunk, state.next_chunk)  # ahead: once its length is known
    end = tcfg.stop_at_step or tcfg.steps  # a compare trunk stops early; its LR schedule is that of tcfg.steps
    while state.step < end:
        t_wait = time.perf_counter()
        try:
            chunk = ray.get(next_ref)
        except UserError as err:  # bad data found by the stream: the driver reports it in one line
            logger.error("stopping: %s", err)
            return {"steps": state.step, "stopped_by_user_error": True}
        wait_s = time.perf_counter() - t_wait + checkpointer.take_carried_wait()
        after = end - (state.step + chunk.steps - state.position)  # steps left once this chunk is trained
        # prefetch the next decided chunk, if the run trains one, and nothing past the run's last chunk
        last = chunk.chunk_id + -(-after // max(chunk.steps, 1))  # at this chunk's length
        next_ref = coordinator.get_chunk.remote(chunk.chunk_id + 1, last) if after > 0 else None
        steps_log.chunk_started(chunk, wait_s, state.position)
        chunk_losses = np.full((chunk.steps, tcfg.global_batch_size), np.nan, dtype=np.float32)
        first_position = state.position
        pending = chunk.batch_refs[first_position] if first_position < chunk.steps else None
        for p in range(first_position, chunk.steps):
            step_start = time.perf_counter()
            batch = ray.get(pending)
            pending = chunk.batch_refs[p + 1] if p + 1 < chunk.steps else None
            faults.inject(run_dir, "train_step", rank=rank, step=state.step)
            step_stats = train_step(engine, batch, my_rows, tcfg.micro_batch_size, device,
                                    partial(micro_weights, chunk, p))
            stats = all_ranks(step_stats, world)  # (W, 1 + B/W): every rank's step loss and per-sample losses
            loss_value = float(stats[:, 0].sum()) / world
            chunk_losses[p] = stats[:, 1:].reshape(-1)
            state.step, state.position = state.step + 1, p + 1
            state.tokens += int(batch.n_tokens.sum())
            steps_log.step(state, chunk, p, loss_value, engine, step_start, wait_s if p == first_position else 0.0)
            evaluator.after_step(state.step, end)
            if state.step >= end:
                break

        chunk_done, finished = state.position >= chunk.steps, state.step >= end
        if chunk_done:
            state.next_chunk, state.position = chunk.chunk_id + 1, 0
        checkpointer.chunk_ended(state, chunk_done, finished)
        if chunk_done:  # feedback, then the next version's snapshot / sketches (the trainers' own: after the save)
            steps_log.chunk_trained(state.step, chunk, chunk_losses)
            t_boundary = time.perf_counter()
            trainer_side.chunk_trained(chunk, chunk_losses, state.step, more=not finished)
            boundary_s = time.perf_counter() - t_boundary
        if finished:
            evaluator.run(state.step)
        checkpointer.save_if_due(state, next_ref, {"step": state.step, "train/loss": loss_value,
                                                   "data/tokens": state.tokens, "chunk_id": chunk.chunk_id},
                                 evaluator.last)
        if chunk_done:
            t_boundary = time.perf_counter()
            trainer_side.after_checkpoint(chunk, state.step, more=not finished)
            steps_log.boundary(state.step, boundary_s + time.perf_counter() - t_boundary)

    return {**steps_log.final(state, loss_value), **evaluator.last}
