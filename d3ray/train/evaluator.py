"""The training loop's evaluations: when they run, what they run, and what they log.

Every ``train.eval_every`` steps inside the run, and once at its end: the held-out loss and perplexity of
each eval set (d3ray/train/evaluation.py, every rank its rows) and the ``eval.tasks`` of lm-evaluation-harness
(rank 0 scores, the other ranks wait). Rank 0 logs the metrics row and the seconds it took
(``time/eval_sec``: part of the loop's wall time) and prints one line:

    eval step 60 | mean loss 5.1234 | ppl arxiv=160.2 c4=171.9
"""

from __future__ import annotations

import time
from typing import Any

from d3ray.train.metrics import RunLogs
from d3ray.train.trainer_rank import TrainerRank

__all__ = ["Evaluator", "harness_metrics"]


def harness_metrics(trainer: TrainerRank, tasks: list[Any], tokenizer_dir: str) -> dict[str, float]:
    """``eval.tasks`` through lm-evaluation-harness on rank 0 (the other ranks wait; under ZeRO-3 every
    rank takes part in gathering the full parameters first)."""
    import contextlib

    import torch.distributed as dist

    from d3ray.data.tokenizer import load_tokenizer
    from d3ray.deepspeed_import import import_deepspeed
    from d3ray.eval.harness import run_eval_tasks

    deepspeed = import_deepspeed()
    engine = trainer.engine
    gather = (deepspeed.zero.GatheredParameters(list(engine.module.parameters())) if trainer.zero_stage == 3
              else contextlib.nullcontext())
    metrics: dict[str, float] = {}
    with gather:
        if trainer.is_rank0:
            metrics = run_eval_tasks(engine.module, load_tokenizer(tokenizer_dir), tasks)
        if dist.is_initialized():
            dist.barrier()
    return metrics


class Evaluator:
    """Owns the eval cadence (see the module docstring); every rank calls the same methods at the same steps.

    Args:
        trainer: this rank.
        eval_sets: name → held-out sequences (``load_eval_sets``), or {}.
        tasks: the prepared lm-eval tasks, or [].
        tokenizer_dir: the run's tokenizer (the harness decodes with it).
        micro_batch_size: rows per forward.
        device: where the forwards run.
        every: ``train.eval_every`` (0: only at the end).
        logs: rank 0's run-directory logs, or None.
    """

    def __init__(self, trainer: TrainerRank, eval_sets: dict[str, Any], tasks: list[Any], tokenizer_dir: str,
                 micro_batch_size: int, device: Any, every: int, logs: RunLogs | None) -> None:
        self.trainer, self.eval_sets, self.tasks, self.tokenizer_dir = trainer, eval_sets, tasks, tokenizer_dir
        self.micro_batch_size, self.device, self.every, self.logs = micro_batch_size, device, every, logs
        self.last: dict[str, float] = {}
        """The newest evaluation's metrics ({} before the first): a checkpoint's report carries them."""

    def after_step(self, step: int, end: int) -> None:
        """Evaluate when ``step`` is a multiple of ``train.eval_every`` before the last step (the last has its own)."""
        if self.every and step % self.every == 0 and step < end:
            self.run(step)

    def run(self, step: int) -> dict[str, float]:
        """Evaluate now (at ``step``), log the metrics and their seconds, keep them as :attr:`last`."""
        start = time.perf_counter()
        result = self._evaluate(step)
        if self.logs is not None:
            self.logs.log_metrics({"step": step, "time/eval_sec": time.perf_counter() - start})
        self.last = result
        return result

    def _evaluate(self, step: int) -> dict[str, float]:
        from d3ray.train.evaluation import evaluate

        if not self.eval_sets and not self.tasks:
            return {}
        trainer = self.trainer
        result = evaluate(trainer, self.eval_sets, self.micro_batch_size, self.device) if self.eval_sets else {}
        if self.tasks:
            result.update(harness_metrics(trainer, self.tasks, self.tokenizer_dir))
        if self.logs is not None:
            self.logs.log_metrics({"step": step, **result})
            summary = " ".join(f"{k.split('/')[1]}={v:.1f}" for k, v in result.items() if k.endswith("/ppl"))
            print(f"eval step {step} | mean loss {result.get('eval/mean_loss', float('nan')):.4f} | ppl {summary}",
                  flush=True)
        return result
