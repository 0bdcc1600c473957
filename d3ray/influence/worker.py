"""InfluenceWorker: a thin actor shell that holds a model and calls the pure chunk functions.

A plain class (docs/design/conventions.md §3): the pipeline wraps it where it creates it,
``ray.remote(InfluenceWorker).options(num_gpus=1).remote(model_config, config)``, and tests call it
directly. It holds a causal LM built by :func:`d3ray.model.build_model` from a config dict (no hub
download), loads each weights snapshot it is given, turns batches into objectives, and calls
:func:`~d3ray.influence.chunk.sketch_chunk` or :func:`~d3ray.influence.chunk.lookahead_rows`:

    snapshot (list of ObjectRefs: weights dict name → array [, AdamWState]) ─► load into the model
    batches (b, T) token ids ─► sample sequences ─► objectives ─► sketch_chunk / lookahead_rows

Determinism: P depends only on the sketch config and parameter names (see sketch.py); the sequence
subset, Hutchinson probes and GNB labels of a batch depend only on (config.seed, batch id) and the
device type. So the rows of a batch are the same whichever worker computes them.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.func import functional_call

from d3ray.influence.chunk import lookahead_rows, parameter_names, potential_chunk, sketch_chunk
from d3ray.influence.config import InfluenceConfig
from d3ray.influence.influence import BatchSketches, LookaheadRows, Reference
from d3ray.influence.optimizer import AdamWState
from d3ray.influence.resources import actor_device, actor_threads
from d3ray.influence.sketch import stable_seed
from d3ray.influence.snapshot import load_snapshot, split_snapshot
from d3ray.influence.statistics import BatchStatistics, CrossEntropyObjective, Params
from d3ray.model.lora import LoraConfig
from d3ray.ray_refs import is_object_ref, resolve

logger = logging.getLogger(__name__)

__all__ = ["InfluenceWorker", "causal_logits", "influence_attention", "sample_rows", "sampled_objective",
           "takes_logits_to_keep"]

def influence_attention(requested: str, double_backward: bool) -> str:
    """The attention kernel of an influence model: eager where the estimator differentiates a gradient
    again (Hutchinson: double backward through SDPA fails on CPU), else the trainers' own; flash-attention
    runs only in 16 bits, so the fp32/fp64 influence model takes SDPA in its place."""
    if double_backward:
        return "eager"
    return "sdpa" if requested == "flash_attention_2" else requested


def takes_logits_to_keep(model: torch.nn.Module) -> bool:
    """Whether the causal LM's forward (a PEFT wrapper's base model's) takes ``logits_to_keep``."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "logits_to_keep" in inspect.signature(base.forward).parameters


def sample_rows(n_rows: int, fraction: float, seed: int, batch_id: int) -> np.ndarray:
    """Sorted indices of the max(1, round(fraction · n_rows)) sequences used from a batch, fixed by (seed, id)."""
    take = max(1, int(round(fraction * n_rows)))
    if take >= n_rows:
        return np.arange(n_rows)
    rng = np.random.default_rng(stable_seed("rows", seed, batch_id))
    return np.sort(rng.choice(n_rows, size=take, replace=False))


def sampled_objective(ids: Any, labels: Any, config: InfluenceConfig, batch_id: int,
                      logits_fn: Callable[[Params, torch.Tensor], torch.Tensor],
                      device: torch.device) -> CrossEntropyObjective:
    """The loss of batch ``batch_id``'s sampled sequences (:func:`sample_rows`, ``config.sample_fraction``):
    ``ids`` an int (b, T) array, ``labels`` the same shape with −100 where unscored, or None (every next
    token). The one definition of "the batch" that every scorer (actor or trainer) shares."""
    ids = np.asarray(ids)
    if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"batch {batch_id}: token ids must be an int (b, T) array, got {ids.dtype} {ids.shape}")
    rows = sample_rows(ids.shape[0], config.sample_fraction, config.seed, batch_id)
    input_ids = torch.as_tensor(ids[rows], dtype=torch.int64, device=device)  # (b', T)
    if labels is None:
        targets = input_ids[:, 1:]
    else:
        targets = torch.as_tensor(np.asarray(labels)[rows], dtype=torch.int64, device=device)[:, 1:]
    return CrossEntropyObjective(logits_fn=logits_fn, inputs=input_ids, labels=targets)


def causal_logits(model: torch.nn.Module, params: Params, input_ids: torch.Tensor, keeps_logits: bool) -> torch.Tensor:
    """(b, T−1, V) next-token logits of ``model`` at ``params`` (parameters not in it are the model's own).

    Where the model takes ``logits_to_keep`` (transformers' causal LMs, ``keeps_logits``), the LM head runs
    on positions 0..T−2 only and the logits come out contiguous: slicing them afterwards computed the last
    position's logits and copied the pass's largest tensor for the loss, 60% of a forward of the tiny
    GPT-2 here (README.md, "The LM head on the scored positions only").
    """
    if not keeps_logits:
        return functional_call(model, params, (input_ids,)).logits[:, :-1]
    keep = torch.arange(input_ids.shape[1] - 1, device=input_ids.device)
    return functional_call(model, params, (input_ids,), {"logits_to_keep": keep}).logits


class InfluenceWorker:
    """Sketches of batches (Taylor estimators) or exact look-ahead rows, at given weights.

    Args:
        model_config: transformers config dict (must hold ``model_type``), e.g. from
            :func:`d3ray.model.model_config_dict`.
        config: the run's InfluenceConfig (same on every worker).
        lora: the trainers' adapters (influence then covers only their parameters).
        attn_implementation: the trainers' attention kernel (``ModelConfig.attn_implementation``); see
            :func:`influence_attention` for what the influence model runs.

    Raises:
        ValueError: ``param_filter`` matches no parameter.
    """

    def __init__(self, model_config: Mapping[str, Any], config: InfluenceConfig, lora: LoraConfig | None = None,
                 attn_implementation: str = "eager") -> None:
        from d3ray.model import ModelConfig, build_model

        self.config = config
        self.device = actor_device(config.device)  # `auto` follows the actor's Ray resources (resources.py)
        torch.set_num_threads(actor_threads())
        self.dtype = torch.float64 if config.dtype == "float64" else torch.float32
        # Eval mode: no dropout. With LoRA the same adapters as the trainers'.
        attention = influence_attention(attn_implementation, config.estimator.needs_double_backward)
        model = build_model(dict(model_config), ModelConfig(attn_implementation=attention, lora=lora))
        trainable = [n for n, p in model.named_parameters() if p.requires_grad]
        self.model = model.eval().to(device=self.device, dtype=self.dtype)
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.names = parameter_names(trainable, config.param_filter)
        self._keeps_logits = takes_logits_to_keep(self.model)
        if not self.names:
            raise ValueError(f"param_filter {config.param_filter!r} matches no parameter of the model")
        if config.estimator.is_exact_lookahead and config.dtype == "float32" and config.gamma < 1e-2:
            if config.preconditioner == "none":
                logger.warning(
                    "lookahead in float32 with gamma=%g: loss differences this small are dominated by "
                    "rounding; use gamma >= 1e-2 or dtype float64",
                    config.gamma,
                )
        self.sketch = config.sketch.build()
        self._loaded_key: str | None = None
        self.optimizer: AdamWState | None = None
        logger.info(
            "InfluenceWorker: %s, preconditioner %s, %d of %d parameter tensors (%d numbers), device %s, %s",
            config.estimator.describe(),
            config.preconditioner,
            len(self.names),
            len(list(self.model.parameters())),
            self.num_params,
            self.device,
            config.dtype,
        )

    @property
    def num_params(self) -> int:
        """d: the number of parameters that take part."""
        named = dict(self.model.named_parameters())
        return sum(named[n].numel() for n in self.names)

    # ---- weights -------------------------------------------------------------------------------
    def load_weights(self, weights: Sequence[Any] | Mapping[str, Any]) -> None:
        """Copy a snapshot into the model (skipped when the same ObjectRefs were loaded last), strictly
        (:func:`~d3ray.influence.snapshot.load_snapshot`).

        Args:
            weights: name → array (numpy or torch, any float dtype: a bfloat16 snapshot, the D3
                default, or ZeRO-3 gathered fp16 is cast to the compute dtype),
                or a list of parts (ObjectRefs, list-wrapped so Ray does not resolve them): weights
                dicts (merged) and at most one :class:`~d3ray.influence.optimizer.AdamWState`, kept
                as ``self.optimizer``. A leading ``module.`` is stripped; a tied weight (GPT-2's
                lm_head) may be absent.

        Raises:
            ValueError: a model tensor is missing or has another shape, or the snapshot has unknown keys.
        """
        key = None
        if not isinstance(weights, Mapping):
            refs = list(weights)
            # Only ObjectRefs name an immutable snapshot; anything else is loaded every time.
            if refs and all(is_object_ref(r) for r in refs):
                key = ",".join(r.hex() for r in refs)
                if key == self._loaded_key:
                    return
        state, self.optimizer = split_snapshot(weights)
        load_snapshot(self.model, state)
        self._loaded_key = key

    # ---- batches -------------------------------------------------------------------------------
    def objective(self, batch: Any, batch_id: int) -> CrossEntropyObjective:
        """The loss of the sampled sequences of one batch: ndarray ids, (ids, labels) or {input_ids, labels}."""
        batch = resolve(batch)
        if isinstance(batch, Mapping):
            ids, labels = batch["input_ids"], batch.get("labels")
        elif isinstance(batch, (tuple, list)):
            ids, labels = batch
        else:
            ids, labels = batch, None
        return sampled_objective(ids, labels, self.config, batch_id, self._logits, self.device)

    def _logits(self, params: Params, input_ids: torch.Tensor) -> torch.Tensor:
        """(b, T−1, V) next-token logits; parameters not in ``params`` are the model's (frozen) ones."""
        return causal_logits(self.model, params, input_ids, self._keeps_logits)

    def leaves(self) -> Params:
        """name → a fresh leaf (requires_grad) of each parameter that takes part, at the loaded weights."""
        named = dict(self.model.named_parameters())
        return {n: named[n].detach().requires_grad_(True) for n in self.names}

    def generator(self, batch_id: int) -> torch.Generator:
        """The per-batch source of probes / sampled labels, fixed by (config.seed, batch id)."""
        gen = torch.Generator(device=self.device)
        gen.manual_seed(stable_seed("probes", self.config.seed, batch_id))
        return gen

    def _statistics(self, batches: Sequence[Any], batch_ids: Sequence[int], params: Params) -> Iterator[BatchStatistics]:
        for batch, bid in zip(batches, batch_ids, strict=True):
            yield self.config.estimator.statistics(self.objective(batch, bid), params, self.generator(bid))

    def sketch_batches(
        self,
        weights: Sequence[Any] | Mapping[str, Any],
        batches: Sequence[Any],
        batch_ids: Sequence[int],
        reference: Reference | Sequence[Any] | None = None,
        return_means: bool = False,
    ) -> BatchSketches:
        """Rows P g, P(u ⊙ u), P h (and P u) of each batch (Taylor estimators): see
        :func:`~d3ray.influence.chunk.sketch_chunk`.

        Args:
            weights: snapshot (see :meth:`load_weights`).
            batches: per batch an int (b, T) array of token ids (labels = ids, causal LM mean loss), an
                (ids, labels) pair with −100 for unscored positions, or {"input_ids", "labels"}; each may
                be an ObjectRef.
            batch_ids: ids of the batches (seed the per-batch draws; key the rows when merging).
            reference: control-variate reference shared by all workers of the chunk (or a list holding
                an ObjectRef to one); None = this call's mean (right when one call covers the chunk).
            return_means: also return full-dimension means (for the next chunk's reference).
        """
        if self.config.estimator.is_exact_lookahead:
            raise ValueError("the lookahead estimator has no sketches; call lookahead_matrix")
        if len(batches) != len(batch_ids):
            raise ValueError(f"{len(batches)} batches but {len(batch_ids)} batch ids")
        start = time.perf_counter()
        self.load_weights(weights)
        t_load = time.perf_counter() - start
        ref = None if reference is None else resolve(reference[0] if isinstance(reference, Sequence) else reference)
        params = self.leaves()
        if self._batches_potential(ref, return_means):
            objectives = [self.objective(b, bid) for b, bid in zip(batches, batch_ids, strict=True)]
            out = potential_chunk(objectives, batch_ids, params, self.config, self.optimizer)
        else:
            out = sketch_chunk(
                self._statistics(batches, batch_ids, params), batch_ids, params, self.config, self.sketch,
                reference=ref, return_means=return_means, optimizer=self.optimizer,
            )
        out.timings["influence/load_sec"] = t_load
        out.timings["influence/total_sec"] = time.perf_counter() - start
        return out

    def _batches_potential(self, reference: Reference | None, return_means: bool) -> bool:
        """Whether this call is the drift potential alone, computed in batched JVP passes (no gradient,
        so no means for a control-variate reference and none used)."""
        return (self.config.estimator.batches_potential and self.config.needs_optimizer_state
                and reference is None and not return_means)

    def lookahead_matrix(
        self,
        weights: Sequence[Any] | Mapping[str, Any],
        batches: Sequence[Any],
        batch_ids: Sequence[int],
        gamma: float | None = None,
        rows: Sequence[int] | None = None,
    ) -> LookaheadRows:
        """Exact look-ahead rows I[i → j] = ℓ(B_j; θ + Δθ_i) − ℓ(B_j; θ) (``lookahead`` estimator).

        Every worker needs all L batches of the chunk (they are the columns); the rows i may be split
        across workers with ``rows`` and merged with ``config.estimator.merge``. See
        :func:`~d3ray.influence.chunk.lookahead_rows`.
        """
        start = time.perf_counter()
        self.load_weights(weights)
        objectives = [self.objective(b, bid) for b, bid in zip(batches, batch_ids, strict=True)]
        out = lookahead_rows(
            objectives, batch_ids, self.leaves(), self.config, rows=rows, optimizer=self.optimizer, gamma=gamma
        )
        out.timings["influence/total_sec"] = time.perf_counter() - start
        return out
