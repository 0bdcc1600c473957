"""ScoringWorker: model work for schedulers other than D3, one chunk ahead, on an actor.

    weights snapshot (version c − staleness, by ObjectRef; with the AdamW state when the trainers ship it)
    or a fixed model directory
        │ load once per version
        ▼
    candidate batches (refs) ──► losses (n,)            per-sequence token-mean loss   (curricula, loss selection)
                             ──► embeddings (n, H)      mean-pooled last hidden states (TSDS, NEAR)
                             ──► score(scorer) (n,)     a selector's scores: the selector's own pure math over
                                                        the primitives below, its target computed once per
                                                        weights version and cached here (LESS, NICE, TSDS, NEAR, Δ-loss)

Primitives a :class:`Scorer` may call: :meth:`ScoringWorker.sequence_losses` (current model or a reference
model), :meth:`ScoringWorker.embed`, :meth:`ScoringWorker.gradient_features` (per-sequence loss gradients,
optionally transformed, then JL-sketched), :meth:`ScoringWorker.sample_responses` (seeded sampling from the
loaded model), :meth:`ScoringWorker.reference_model`.

A plain class (``ray.remote(ScoringWorker)`` where it is created), so tests can call it directly.
Labels come from :func:`d3ray.data.labels.lm_labels`, losses from :func:`d3ray.model.lm_loss.sequence_losses`:
the trainers' own definitions.

Snapshot layout: ``weights`` is a list of parts (ObjectRefs or the values themselves), read by the
influence stage's one snapshot reader (:mod:`d3ray.influence.snapshot`): an
:class:`~d3ray.influence.optimizer.AdamWState` part is the optimizer state, kept as
:attr:`ScoringWorker.optimizer_state`; every other part is a model state dict (name → array), loaded
strictly (an unknown or missing key is an error that names it).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Hashable, Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from d3ray.data.labels import lm_labels
from d3ray.influence.optimizer import AdamWState
from d3ray.influence.resources import actor_device, actor_threads
from d3ray.influence.snapshot import load_snapshot, split_snapshot
from d3ray.ray_refs import ref_key, resolve
from d3ray.run_files import route_logs_to_run_dir

logger = logging.getLogger(__name__)


class Scorer(Protocol):
    """A selector's scoring rule, run on the ScoringWorker (picklable; see the module docstring)."""

    def target_key(self) -> Hashable:
        """Identifies the target computation (cached per weights version under this key)."""
        ...

    def target(self, worker: ScoringWorker) -> Any:
        """What the rule compares candidates with (e.g. target embeddings), at the loaded weights."""
        ...

    def scores(self, worker: ScoringWorker, batches: list[Any], target: Any) -> np.ndarray:
        """(n,) scores of the candidates of ``batches`` (flat, batch by batch); higher = keep."""
        ...


def sequence_arrays(batch: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(input_ids (b, T) int64, n_tokens (b,), labels (b, T) int64) of a GlobalBatch, of a held-out set
    of full sequences ((n, T) array: pre-training) or of a held-out SFT set (``{input_ids, n_tokens,
    loss_mask}``: only the responses are labels)."""
    if isinstance(batch, np.ndarray):
        ids = np.asarray(batch, dtype=np.int64)
        n_tokens = np.full(len(ids), ids.shape[1], dtype=np.int64)
        return ids, n_tokens, lm_labels(ids, n_tokens)
    if isinstance(batch, Mapping):
        ids = np.asarray(batch["input_ids"], dtype=np.int64)
        n_tokens = np.asarray(batch["n_tokens"], dtype=np.int64)
        return ids, n_tokens, lm_labels(ids, n_tokens, batch.get("loss_mask"))
    ids = np.asarray(batch.input_ids, dtype=np.int64)
    n_tokens = np.asarray(batch.n_tokens, dtype=np.int64)
    return ids, n_tokens, lm_labels(ids, n_tokens, batch.loss_mask)


class ScoringWorker:
    """Holds one model and scores batches of sequences with it.

    Args:
        model_config: the trainers' transformers config dict (``build_model`` rebuilds the model).
        model: the run's ``ModelConfig``.
        reference: a local Hugging Face model directory to score with (fixed weights), or None to
            score with the weights snapshots passed to each call.
        micro_batch_size: sequences per forward pass (and per vmapped per-sequence-gradient call).
        run_dir: the run directory (logs go to ``<run_dir>/logs/<role>.log``), or None.
    """

    def __init__(self, model_config: dict[str, Any], model: Any, reference: str | None = None,
                 micro_batch_size: int = 8, run_dir: str | None = None, role: str = "scorer") -> None:
        import torch

        if run_dir is not None:
            route_logs_to_run_dir(run_dir, role)
        self.run_dir, self.role = run_dir, role
        # The device and threads this actor reserved (influence/resources.py): a GPU share → its GPU;
        # none → the CPU even where cuda:0 is visible; as many threads as reserved CPUs.
        torch.set_num_threads(actor_threads())
        self.device = actor_device("auto")
        self.micro = micro_batch_size
        self.model_config = model_config
        self.model_cfg = model
        self.version_key: Any = None
        self.optimizer_state: AdamWState | None = None
        """The optimizer part of the loaded snapshot (carries ``exp_avg_sq``), or None."""
        self._target_key: Any = None
        self._target: Any = None
        self._references: dict[str, Any] = {}
        self._memo: dict[Hashable, Any] = {}
        if reference is not None:
            from transformers import AutoModelForCausalLM

            self.model = AutoModelForCausalLM.from_pretrained(reference, local_files_only=True)
            self.version_key = ("reference", reference)
        else:
            from d3ray.model import build_model

            self.model = build_model(model_config, model)
        self.model.eval().to(self.device)
        self.reference = reference

    # ---- weights -------------------------------------------------------------------------------
    def _load(self, weights: list | None) -> None:
        if self.reference is not None:
            return
        if weights is None:
            raise ValueError("ScoringWorker without a reference model needs a weights snapshot")
        key = tuple(ref_key(part) for part in weights)
        if key == self.version_key:
            return
        state, self.optimizer_state = split_snapshot(weights)
        load_snapshot(self.model, state)
        self.version_key = key

    def _batches(self, batch_refs: list) -> list[Any]:
        return [resolve(r) for r in batch_refs]

    # ---- primitives (for Scorers) --------------------------------------------------------------
    def sequence_losses(self, ids: np.ndarray, labels: np.ndarray, model: Any = None) -> np.ndarray:
        """Per-sequence token-mean losses (n,) float64 of ``model`` (default: the loaded one)."""
        import torch

        from d3ray.model.lm_loss import sequence_losses

        model = self.model if model is None else model
        out = []
        with torch.no_grad():
            for m in range(0, len(ids), self.micro):
                logits = model(input_ids=torch.as_tensor(ids[m:m + self.micro], device=self.device)).logits
                sums, counts = sequence_losses(logits, torch.as_tensor(labels[m:m + self.micro], device=self.device))
                out.append((sums / counts.clamp(min=1.0)).double().cpu().numpy())
        return np.concatenate(out) if out else np.zeros(0)

    def embed(self, ids: np.ndarray, n_tokens: np.ndarray) -> np.ndarray:
        """Mean-pooled last hidden states over each row's valid tokens: (n, H) float32."""
        import torch

        out = []
        with torch.no_grad():
            for m in range(0, len(ids), self.micro):
                part = torch.as_tensor(ids[m:m + self.micro], device=self.device)
                hidden = self.model(input_ids=part, output_hidden_states=True).hidden_states[-1]  # (b, T, H)
                lengths = torch.as_tensor(n_tokens[m:m + self.micro], device=self.device)
                valid = torch.arange(part.shape[1], device=self.device)[None, :] < lengths[:, None]
                pooled = (hidden * valid[..., None]).sum(1) / valid.sum(1, keepdim=True).clamp(min=1)
                out.append(pooled.float().cpu().numpy())
        return np.concatenate(out) if out else np.zeros((0, 0), dtype=np.float32)

    def parameter_names(self, param_filter: str | None) -> list[str]:
        """Names of the trainable parameters (``requires_grad``: with LoRA, the adapters) matching
        ``param_filter`` (``re.search``; None = all of them).

        Raises:
            ValueError: nothing matches.
        """
        import re

        pattern = re.compile(param_filter) if param_filter else None
        names = [n for n, p in self.model.named_parameters()
                 if p.requires_grad and (pattern is None or pattern.search(n))]
        if not names:
            raise ValueError(f"param_filter {param_filter!r} matches no trainable parameter of the model")
        return names

    def gradient_features(self, ids: np.ndarray, labels: np.ndarray, sketch: Any, names: list[str],
                          transform: Callable[[dict], dict] | None = None) -> np.ndarray:
        """Sketched per-sequence gradients P·T(∇ℓ_n): (n, k) float32.

        ℓ_n is sequence n's token-mean loss; its gradient over the parameters ``names`` comes from
        ``torch.func.vmap(grad(...))`` over ``micro_batch_size`` sequences at a time (memory: that many
        gradients); ``transform`` (name → (b, *shape) → same) is applied before the sketch (e.g. the
        Adam update direction of LESS); ``sketch`` is a :mod:`d3ray.influence.sketch` map, the same P
        for every call that uses the same sketch config.
        """
        import torch
        from torch.func import functional_call, grad, vmap

        from d3ray.model.lm_loss import sequence_losses

        model = self.model
        params = {n: p.detach() for n, p in model.named_parameters() if n in set(names)}

        def loss(p: dict, row: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            logits = functional_call(model, p, (row[None],)).logits  # (1, T, V)
            sums, counts = sequence_losses(logits, target[None])
            return (sums / counts.clamp(min=1.0))[0]

        per_sequence = vmap(grad(loss), in_dims=(None, 0, 0))
        out = []
        # Outside no_grad the frozen parameters (those not in ``names``) would record an autograd graph;
        # torch.func.grad ignores an enclosing no_grad for its own differentiation.
        with torch.no_grad():
            for m in range(0, len(ids), self.micro):
                grads = per_sequence(params, torch.as_tensor(ids[m:m + self.micro], device=self.device),
                                     torch.as_tensor(labels[m:m + self.micro], device=self.device))  # name → (b, *shape)
                if transform is not None:
                    grads = transform(grads)
                out.append(sketch.project(grads).float().cpu().numpy())  # (b, k)
        return np.concatenate(out) if out else np.zeros((0, 0), dtype=np.float32)

    def sample_responses(self, prompt_ids: np.ndarray, samples: int, max_new_tokens: int, temperature: float,
                         seed: int, eos_id: int) -> list[np.ndarray]:
        """``samples`` responses of the loaded model to one prompt, seeded by ``seed`` (see
        :func:`d3ray.schedule.sampling.sample_responses`; the policy of NICE)."""
        from d3ray.schedule.sampling import sample_responses

        return sample_responses(self.model, prompt_ids, samples, max_new_tokens, temperature, seed, eos_id)

    def memo(self, key: Hashable, factory: Callable[[], Any]) -> Any:
        """``factory()`` made once per ``key`` for the actor's lifetime (e.g. a sketch whose hashed rows
        are worth keeping across weights versions)."""
        if key not in self._memo:
            self._memo[key] = factory()
        return self._memo[key]

    def reference_model(self, path: str) -> Any:
        """A second, fixed model (cached): a Hugging Face directory, or an ``.npz`` of a state dict
        (written by :meth:`save_weights`) loaded into the run's architecture."""
        if path not in self._references:
            if os.path.isdir(path):
                from transformers import AutoModelForCausalLM

                ref = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
            else:
                from d3ray.model import build_model

                ref = build_model(self.model_config, self.model_cfg)
                with np.load(path) as saved:
                    load_snapshot(ref, {k: saved[k] for k in saved.files})
            self._references = {path: ref.eval().to(self.device)}  # one at a time
        return self._references[path]

    def save_weights(self, weights: list, path: str) -> bool:
        """Write the model part of a snapshot to ``path`` (``.npz``) unless it exists; True if written."""
        if os.path.exists(path):
            return False
        state, _ = split_snapshot(weights)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp.npz"
        np.savez(tmp, **{k: np.asarray(v) for k, v in state.items()})
        os.replace(tmp, path)
        return True

    def _record_busy(self, call: str, rows: int, started: float) -> None:
        """One line of ``<run_dir>/scoring_log.jsonl`` per call: the seconds this actor worked on it
        (the compute accounting of ``d3ray compare``; a scheduler's own records hold latencies)."""
        if self.run_dir is None:
            return
        line = {"role": self.role, "call": call, "rows": rows, "sec": time.perf_counter() - started, "pid": os.getpid()}
        with open(Path(self.run_dir) / "scoring_log.jsonl", "a") as fh:
            fh.write(json.dumps(line) + "\n")

    # ---- calls -----------------------------------------------------------------------------------
    def losses(self, weights: list | None, batch_refs: list) -> np.ndarray:
        """Per-sequence token-mean losses of every row of every batch, in order: (n,) float64."""
        started = time.perf_counter()
        self._load(weights)
        out = [self.sequence_losses(ids, labels) for ids, _, labels in map(sequence_arrays, self._batches(batch_refs))]
        scores = np.concatenate(out) if out else np.zeros(0)
        self._record_busy("losses", len(scores), started)
        return scores

    def embeddings(self, weights: list | None, batch_refs: list) -> np.ndarray:
        """Mean-pooled last hidden states of every row (over its valid tokens): (n, H) float32."""
        started = time.perf_counter()
        self._load(weights)
        out = [self.embed(ids, n_tokens) for ids, n_tokens, _ in map(sequence_arrays, self._batches(batch_refs))]
        pooled = np.concatenate(out) if out else np.zeros((0, 0), dtype=np.float32)
        self._record_busy("embeddings", len(pooled), started)
        return pooled

    def score(self, weights: list | None, batch_refs: list, scorer: Scorer) -> np.ndarray:
        """``scorer``'s (n,) scores of the candidates of ``batch_refs`` at ``weights``; its target is
        computed once per (target, weights version) and cached."""
        started = time.perf_counter()
        self._load(weights)
        key = (scorer.target_key(), self.version_key)
        if key != self._target_key:
            self._target, self._target_key = None, None  # never keep a stale target after a failure
            self._target = scorer.target(self)
            self._target_key = key
        scores = np.asarray(scorer.scores(self, self._batches(batch_refs), self._target), dtype=np.float64)
        if not np.all(np.isfinite(scores)):
            raise ValueError(f"{type(scorer).__name__}: non-finite selection scores")
        self._record_busy(type(scorer).__name__, len(scores), started)
        return scores


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
