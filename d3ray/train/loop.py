"""The per-worker training loop: one linear function, run by every Ray Train worker.

    resume (DeepSpeed state, RNG, data cursor) ─► for each ordered chunk from the coordinator:
        for each batch in the chunk's decided order: this rank's rows → micro-batches → step
        publish a weights snapshot (schedulers that need weights) → checkpoint every N chunks

Every rank pulls the same ``OrderedChunk`` from the ScheduleCoordinator and takes its contiguous
share of each global batch (rows ``rank*B/W .. (rank+1)*B/W``), so the data seen does not depend
on the number of workers, and every rank runs the same number of steps (collectives never hang).
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from d3ray.config import RunConfig

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
    publish_weights: bool
    publish_optimizer_state: bool = False
    """Ship the AdamW state with each weights snapshot (influence ``preconditioner: adam``)."""


def publish_snapshot(engine, zero_stage: int, rank: int, coordinator, version: int, optimizer_state: bool) -> None:
    """Put a float32 numpy state dict (and the AdamW state if asked) in the object store and hand the
    refs to the coordinator. Collectives under ZeRO (d3ray/train/snapshot.py): every rank calls."""
    import ray

    from d3ray.train.snapshot import snapshot_optimizer_state, snapshot_weights

    parts = [snapshot_weights(engine, zero_stage, rank)]
    if optimizer_state:
        parts.append(snapshot_optimizer_state(engine, zero_stage, rank))
    if rank == 0:
        coordinator.publish_weights.remote(version, [ray.put(p) for p in parts])


def train_loop_per_worker(config: dict[str, Any]) -> dict[str, Any]:
    """Ray Train entry point; returns rank 0's final metrics (→ ``Result.return_value``)."""
    import deepspeed
    import ray
    import ray.train
    import torch
    import torch.distributed as dist

    from d3ray.model import build_model
    from d3ray.train.checkpoint import TrainState, load_checkpoint, save_checkpoint
    from d3ray.train.deepspeed_config import deepspeed_config, lr_factor
    from d3ray.train.evaluation import causal_lm_labels, evaluate
    from d3ray.train.metrics import RunLogs, progress_line

    # Ray Train logs two INFO lines per checkpoint report; the progress line says what matters.
    logging.getLogger("ray.train").setLevel(logging.WARNING)
    spec: WorkerSpec = config["spec"]
    cfg, tcfg = spec.cfg, spec.cfg.train
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    if world != tcfg.num_workers:
        raise RuntimeError(f"expected {tcfg.num_workers} workers, Ray Train started {world}")
    deepspeed.init_distributed(dist_backend="nccl" if tcfg.use_gpu else "gloo")
    device = torch.device("cuda", torch.cuda.current_device()) if tcfg.use_gpu else torch.device("cpu")

    torch.manual_seed(cfg.seed)
    model = build_model(spec.model_config, cfg.model)
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        model_parameters=[p for p in model.parameters() if p.requires_grad],
        config=deepspeed_config(tcfg),
        lr_scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, partial(lr_factor, cfg=tcfg)),
    )

    state = TrainState()
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            state = load_checkpoint(engine, Path(d), rank)
        logger.info("rank %d resumed at step %d, chunk %d+%d", rank, state.step, state.next_chunk, state.position)
    coordinator = spec.coordinator
    if state.schedule_orders:
        ray.get(coordinator.restore_decisions.remote({int(k): v for k, v in state.schedule_orders.items()}))

    run_dir = cfg.run_dir
    logs = RunLogs(run_dir, state.step, state.next_chunk + (1 if state.position else 0)) if rank == 0 else None
    eval_sets = ray.get(spec.eval_sets[0]) if spec.eval_sets else {}
    per_rank = tcfg.global_batch_size // world
    micro = tcfg.micro_batch_size
    last_eval: dict[str, float] = {}
    fail_marker = run_dir / f".fail_at_step_{tcfg.fail_at_step}.done"

    if spec.publish_weights:  # the weights the next chunk may be scored at (fresh start or resume)
        publish_snapshot(engine, tcfg.zero_stage, rank, coordinator, state.next_chunk, spec.publish_optimizer_state)

    def run_eval() -> dict[str, float]:
        if not eval_sets:
            return {}
        result = evaluate(engine, eval_sets, rank, world, tcfg.micro_batch_size, device)
        if logs is not None:
            logs.log_metrics({"step": state.step, **result})
            summary = " ".join(f"{k.split('/')[1]}={v:.1f}" for k, v in result.items() if k.endswith("/ppl"))
            print(f"eval step {state.step} | mean loss {result.get('eval/mean_loss', float('nan')):.4f} | ppl {summary}",
                  flush=True)
        return result

    start_time = time.perf_counter()
    start_tokens = state.tokens
    loss_value = float("nan")
    next_ref = coordinator.get_chunk.remote(state.next_chunk)
    while state.step < tcfg.steps:
        t_wait = time.perf_counter()
        chunk = ray.get(next_ref)
        wait_s = time.perf_counter() - t_wait
        next_ref = coordinator.get_chunk.remote(chunk.chunk_id + 1)  # prefetch the next ordered chunk
        if logs is not None and state.position == 0:
            logs.log_schedule({"chunk_id": chunk.chunk_id, "epoch": chunk.epoch, "order": list(chunk.order),
                               "fallback": chunk.decision.fallback, "trainer_wait_sec": wait_s,
                               "weights_version": chunk.weights_version, **chunk.decision.record})
            if chunk.decision.matrix is not None:
                (run_dir / "influence").mkdir(exist_ok=True)
                np.save(run_dir / "influence" / f"S_{chunk.chunk_id:06d}.npy", chunk.decision.matrix)
        positions = list(range(state.position, len(chunk.order)))
        batch_refs = [chunk.batch_refs[chunk.order[p]] for p in positions]
        pending = batch_refs[0] if batch_refs else None
        for i, p in enumerate(positions):
            step_start = time.perf_counter()
            batch = ray.get(pending)
            pending = batch_refs[i + 1] if i + 1 < len(batch_refs) else None
            rows = slice(rank * per_rank, (rank + 1) * per_rank)
            ids_all = torch.tensor(batch.input_ids[rows], dtype=torch.long)
            n_all = torch.tensor(batch.n_tokens[rows], dtype=torch.long)
            if tcfg.fail_at_step == state.step and rank == 0 and not fail_marker.exists():
                fail_marker.touch()
                logger.warning("fault injection: rank 0 exits at step %d", state.step)
                os._exit(1)
            losses = []
            for m in range(0, per_rank, micro):
                ids = ids_all[m:m + micro].to(device)
                labels = causal_lm_labels(ids, n_all[m:m + micro].to(device))
                loss = engine(input_ids=ids, labels=labels).loss
                engine.backward(loss)
                engine.step()
                losses.append(loss.detach().float())
            loss_sum = torch.stack(losses).mean().cpu().reshape(1)
            if world > 1:
                dist.all_reduce(loss_sum)
            loss_value = float(loss_sum) / world
            state.step += 1
            state.position = p + 1
            state.tokens += int(batch.n_tokens.sum())
            if logs is not None:
                elapsed = time.perf_counter() - start_time
                tps = (state.tokens - start_tokens) / max(elapsed, 1e-9)
                lr = engine.get_lr()[0]
                grad_norm = engine.get_global_grad_norm()
                logs.log_samples(state.step, chunk.chunk_id, p, batch.sample_ids, batch.domains)
                logs.log_metrics({"step": state.step, "chunk_id": chunk.chunk_id, "train/loss": loss_value,
                                  "train/lr": lr, "train/grad_norm": float(grad_norm) if grad_norm is not None else None,
                                  "data/tokens": state.tokens, "data/tokens_per_sec": tps,
                                  "time/step_sec": time.perf_counter() - step_start,
                                  "time/wait_sec": wait_s if i == 0 else 0.0})
                if state.step % tcfg.log_every == 0 or state.step == tcfg.steps:
                    print(progress_line(state.step, tcfg.steps, loss_value, tps, lr, wait_s), flush=True)
            if tcfg.eval_every and state.step % tcfg.eval_every == 0 and state.step < tcfg.steps:
                last_eval = run_eval()
            if state.step >= tcfg.steps:
                break
        chunk_done = state.position >= len(chunk.order)
        if chunk_done:
            state.next_chunk, state.position = chunk.chunk_id + 1, 0
            if spec.publish_weights and state.step < tcfg.steps:
                publish_snapshot(engine, tcfg.zero_stage, rank, coordinator, state.next_chunk, spec.publish_optimizer_state)
        finished = state.step >= tcfg.steps
        if finished:
            last_eval = run_eval()
        if finished or (chunk_done and state.next_chunk % tcfg.checkpoint_every_chunks == 0):
            if logs is not None:
                state.schedule_orders = {str(k): v for k, v in logs.schedule_orders().items()}
            metrics = {"step": state.step, "train/loss": loss_value, "data/tokens": state.tokens,
                       "chunk_id": chunk.chunk_id, **{k: v for k, v in last_eval.items() if np.isfinite(v)}}
            with tempfile.TemporaryDirectory() as d:
                save_checkpoint(engine, state, Path(d), rank, Path(spec.tokenizer_dir))
                ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(d))
            if rank == 0:
                coordinator.release.remote(state.next_chunk)

    elapsed = time.perf_counter() - start_time
    if logs is not None:
        logs.close()
    return {"steps": state.step, "final_loss": loss_value, "tokens": state.tokens,
            "tokens_per_sec": (state.tokens - start_tokens) / max(elapsed, 1e-9),
            "train_seconds": elapsed, **last_eval}
