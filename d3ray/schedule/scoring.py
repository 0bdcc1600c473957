"""ScoringWorker: model work for schedulers other than D3, one chunk ahead, on an actor.

    weights snapshot (version c − staleness, by ObjectRef) or a fixed model directory
        │ load once per version
        ▼
    candidate batches (refs) ──► losses (n,)            per-sequence token-mean loss   (curricula, loss selection)
                             ──► embeddings (n, H)      mean-pooled last hidden states (TSDS, NEAR)

A plain class (``ray.remote(ScoringWorker)`` where it is created), so tests can call it directly.
Labels come from :func:`d3ray.data.labels.lm_labels`, losses from :func:`d3ray.lm_loss.sequence_losses`:
the trainers' own definitions.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from d3ray.data.labels import lm_labels
from d3ray.run_files import route_logs_to_run_dir

logger = logging.getLogger(__name__)


class ScoringWorker:
    """Holds one model and scores batches of sequences with it.

    Args:
        model_config: the trainers' transformers config dict (``build_model`` rebuilds the model).
        model: the run's ``ModelConfig``.
        reference: a local Hugging Face model directory to score with (fixed weights), or None to
            score with the weights snapshots passed to each call.
        micro_batch_size: sequences per forward pass.
        run_dir: the run directory (logs go to ``<run_dir>/logs/<role>.log``), or None.
    """

    def __init__(self, model_config: dict[str, Any], model: Any, reference: str | None = None,
                 micro_batch_size: int = 8, run_dir: str | None = None, role: str = "scorer") -> None:
        import torch

        if run_dir is not None:
            route_logs_to_run_dir(run_dir, role)
        self.run_dir, self.role = run_dir, role
        torch.set_num_threads(1)
        self.micro = micro_batch_size
        self.version_key: Any = None
        if reference is not None:
            from transformers import AutoModelForCausalLM

            self.model = AutoModelForCausalLM.from_pretrained(reference, local_files_only=True)
            self.version_key = ("reference", reference)
        else:
            from d3ray.train.model import build_model

            self.model = build_model(model_config, model)
        self.model.eval()
        self.reference = reference

    def _load(self, weights: list | None) -> None:
        import ray
        import torch

        if self.reference is not None:
            return
        if weights is None:
            raise ValueError("ScoringWorker without a reference model needs a weights snapshot")
        key = weights[0].hex() if hasattr(weights[0], "hex") else id(weights[0])
        if key == self.version_key:
            return
        state = ray.get(weights[0]) if hasattr(weights[0], "hex") else weights[0]
        own = self.model.state_dict()
        with torch.no_grad():
            for name, value in state.items():
                if name in own:
                    own[name].copy_(torch.from_numpy(np.asarray(value)).to(own[name].dtype))
        self.version_key = key

    def _batches(self, batch_refs: list) -> list[Any]:
        import ray

        return [ray.get(r) if hasattr(r, "hex") else r for r in batch_refs]

    def _record_busy(self, call: str, rows: int, started: float) -> None:
        """One line of ``<run_dir>/scoring_log.jsonl`` per call: the seconds this actor worked on it
        (the compute accounting of ``d3ray compare``; a scheduler's own records hold latencies)."""
        if self.run_dir is None:
            return
        line = {"role": self.role, "call": call, "rows": rows, "sec": time.perf_counter() - started, "pid": os.getpid()}
        with open(Path(self.run_dir) / "scoring_log.jsonl", "a") as fh:
            fh.write(json.dumps(line) + "\n")

    def losses(self, weights: list | None, batch_refs: list) -> np.ndarray:
        """Per-sequence token-mean losses of every row of every batch, in order: (n,) float64."""
        import torch

        from d3ray.lm_loss import sequence_losses

        started = time.perf_counter()
        self._load(weights)
        out = []
        with torch.no_grad():
            for batch in self._batches(batch_refs):
                labels = lm_labels(batch.input_ids, batch.n_tokens, batch.loss_mask)
                for m in range(0, len(labels), self.micro):
                    ids = torch.as_tensor(np.asarray(batch.input_ids[m:m + self.micro], dtype=np.int64))
                    logits = self.model(input_ids=ids).logits
                    sums, counts = sequence_losses(logits, torch.as_tensor(labels[m:m + self.micro]))
                    out.append((sums / counts.clamp(min=1.0)).double().numpy())
        scores = np.concatenate(out) if out else np.zeros(0)
        self._record_busy("losses", len(scores), started)
        return scores

    def embeddings(self, weights: list | None, batch_refs: list) -> np.ndarray:
        """Mean-pooled last hidden states of every row (over its valid tokens): (n, H) float32."""
        import torch

        started = time.perf_counter()
        self._load(weights)
        out = []
        with torch.no_grad():
            for batch in self._batches(batch_refs):
                n_tokens = np.asarray(batch.n_tokens)
                for m in range(0, len(n_tokens), self.micro):
                    ids = torch.as_tensor(np.asarray(batch.input_ids[m:m + self.micro], dtype=np.int64))
                    hidden = self.model(input_ids=ids, output_hidden_states=True).hidden_states[-1]  # (b, T, H)
                    valid = torch.arange(ids.shape[1])[None, :] < torch.as_tensor(n_tokens[m:m + self.micro])[:, None]
                    pooled = (hidden * valid[..., None]).sum(1) / valid.sum(1, keepdim=True).clamp(min=1)
                    out.append(pooled.float().numpy())
        pooled_all = np.concatenate(out) if out else np.zeros((0, 0), dtype=np.float32)
        self._record_busy("embeddings", len(pooled_all), started)
        return pooled_all


def start_scorer(ctx: Any, reference: str | None, num_cpus: float, num_gpus: float, name: str) -> Any:
    """A ScoringWorker actor for a scheduler (restarted on a crash; its calls are retried)."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    # Own resources, never a Tune trial's placement group (which holds only its driver).
    opts: dict[str, Any] = {"num_cpus": num_cpus, "max_restarts": 2, "max_task_retries": 2,
                            "name": f"d3ray:{ctx.run_name}:{name}",
                            "scheduling_strategy": PlacementGroupSchedulingStrategy(placement_group=None)}
    if num_gpus:
        opts["num_gpus"] = num_gpus
    return ray.remote(ScoringWorker).options(**opts).remote(ctx.model_config, ctx.model, reference,
                                                            run_dir=ctx.run_dir, role=name)
