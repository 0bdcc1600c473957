"""What the training loop records as it goes: per step, per chunk, and the clock of the loop's phases.

Rank 0 writes (``RunLogs``, d3ray/train/metrics.py); on the other ranks every method only keeps the clock.
The rows and their keys are what the run directory's readers expect (the pipeline bench splits the loop
by them: d3ray/lab/bench/pipeline.py ``LOOP_PHASES``):

    chunk_started   the schedule-log row of a decided chunk (``trainer_wait_sec``), at its first step
    step            ``train/loss``, ``train/lr``, ``train/grad_norm``, ``data/tokens``, ``data/tokens_per_sec``,
                    ``time/step_sec``, ``time/wait_sec`` (the chunk's wait, on its first step), the samples
                    trained; every ``train.log_every`` steps the progress line on the console
    chunk_trained   the chunk's per-domain training loss (and a mixer's weights): one row per chunk
    boundary        ``time/chunk_boundary_sec``: the scheduler's work on the ranks between two chunks
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from d3ray.train.checkpoint import TrainState
from d3ray.train.metrics import RunLogs, chunk_domain_metrics, progress_line

__all__ = ["StepLogger"]


class StepLogger:
    """The loop's per-step record and clock (see the module docstring).

    Args:
        logs: rank 0's run-directory logs, or None on the other ranks.
        steps: ``train.steps`` (the progress line's denominator, and its last line).
        log_every: ``train.log_every``: a progress line every so many steps.
        state: where training starts (its tokens are the start of ``data/tokens_per_sec``).
    """

    def __init__(self, logs: RunLogs | None, steps: int, log_every: int, state: TrainState) -> None:
        self.logs, self.steps, self.log_every = logs, steps, log_every
        self.start_tokens = state.tokens
        self.start_time = time.perf_counter()

    def scheduler_ready(self, step: int, seconds: float) -> None:
        """The scheduler's actors are up, after ``seconds`` of waiting (logged when it is not nothing): the
        training loop's clock starts now, so their start-up is not the loop's time."""
        if self.logs is not None and seconds > 0.01:
            self.logs.log_metrics({"step": step, "time/scheduler_ready_sec": seconds})
        self.start_time = time.perf_counter()

    def chunk_started(self, chunk: Any, wait_s: float, position: int) -> None:
        """A chunk's schedule-log row (its decision, and the seconds the trainers waited for it), logged
        once: when its first step is trained here (not when a resumed run re-enters it)."""
        if self.logs is not None and position == 0:
            self.logs.log_chunk(chunk, wait_s)

    def tokens_per_sec(self, state: TrainState) -> float:
        """Tokens trained by this process since its clock started, per second."""
        return (state.tokens - self.start_tokens) / max(time.perf_counter() - self.start_time, 1e-9)

    def step(self, state: TrainState, chunk: Any, position: int, loss: float, engine: Any, step_start: float,
             wait_s: float) -> None:
        """The metrics row and the samples of the step just trained (``state.step``), and the progress line
        when it is due; ``wait_s``: the chunk's wait for its decision, on the chunk's first step here, else 0."""
        if self.logs is None:
            return
        tps = self.tokens_per_sec(state)
        lr = engine.get_lr()[0]
        grad_norm = engine.get_global_grad_norm()
        self.logs.log_samples(state.step, chunk.chunk_id, position, chunk.sample_ids[position], chunk.domains[position])
        self.logs.log_metrics({"step": state.step, "chunk_id": chunk.chunk_id, "train/loss": loss,
                               "train/lr": lr, "train/grad_norm": float(grad_norm) if grad_norm is not None else None,
                               "data/tokens": state.tokens, "data/tokens_per_sec": tps,
                               "time/step_sec": time.perf_counter() - step_start, "time/wait_sec": wait_s})
        if state.step % self.log_every == 0 or state.step == self.steps:
            print(progress_line(state.step, self.steps, loss, tps, lr, wait_s), flush=True)

    def chunk_trained(self, step: int, chunk: Any, losses: np.ndarray) -> None:
        """Per-domain training loss (and the mixer's weights) of a chunk trained to its end: one row."""
        if self.logs is not None:
            self.logs.log_metrics({"step": step, "chunk_id": chunk.chunk_id,
                                   **chunk_domain_metrics([d for ds in chunk.domains for d in ds], losses,
                                                          chunk.mixture)})

    def boundary(self, step: int, seconds: float) -> None:
        """The seconds of the scheduler's work on the ranks between two chunks (feedback, snapshot, scores)."""
        if self.logs is not None:
            self.logs.log_metrics({"step": step, "time/chunk_boundary_sec": seconds})

    def final(self, state: TrainState, loss: float) -> dict[str, Any]:
        """The loop's result: steps, final loss, tokens, tokens per second and seconds since the clock started."""
        elapsed = time.perf_counter() - self.start_time
        if self.logs is not None:
            self.logs.close()
        return {"steps": state.step, "final_loss": loss, "tokens": state.tokens,
                "tokens_per_sec": (state.tokens - self.start_tokens) / max(elapsed, 1e-9), "train_seconds": elapsed}
