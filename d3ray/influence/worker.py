"""InfluenceWorker: per-batch sketches (or exact look-ahead rows) of a chunk at a weights snapshot.

A plain class (STYLE.md §5): the pipeline wraps it where it creates it,
``ray.remote(InfluenceWorker).options(num_gpus=1).remote(model_config, config)``, and tests call it
directly. It holds a transformers causal LM built from a config dict (no hub download), loads each
weights snapshot it is given, and calls the pure functions of :mod:`~d3ray.influence.statistics`,
:mod:`~d3ray.influence.sketch` and :mod:`~d3ray.influence.control_variate`:

    weights (dict name → array, by ObjectRef) ─► load into the model (cast; tied lm_head may be absent)
    batches (b, T) token ids ─► sample sequences ─► loss, g, h per batch ─► P g, P(g⊙g), P h ─► BatchSketches

Determinism: P depends only on the sketch config and parameter names (see sketch.py); the sequence
subset, Hutchinson probes and GNB labels of a batch depend only on (config.seed, batch id) and the
device type. So the rows of a batch are the same whichever worker computes them.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.func import functional_call

from d3ray.influence.config import InfluenceConfig
from d3ray.influence.control_variate import EXTRA_COLUMNS, ControlVariate, Reference
from d3ray.influence.influence import BatchSketches, LookaheadRows
from d3ray.influence.sketch import stable_seed
from d3ray.influence.statistics import (
    BatchStatistics,
    CrossEntropyObjective,
    Params,
    batch_statistics,
    lookahead_influence,
)

logger = logging.getLogger(__name__)

__all__ = ["BatchSketches", "InfluenceWorker", "LookaheadRows", "build_causal_lm", "sample_rows"]

#: Buffers some transformers versions keep in GPT-2 state dicts; a snapshot may carry or omit them.
_OPTIONAL_KEYS = re.compile(r"(^|\.)attn\.(bias|masked_bias)$")


def build_causal_lm(model_config: Mapping[str, Any]) -> torch.nn.Module:
    """A transformers causal LM from a config dict (``GPT2Config(...).to_dict()``), eager attention, eval mode.

    Eager attention because double backward (Hutchinson) through SDPA fails on CPU; eval mode so that
    dropout does not make the statistics random.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(**dict(model_config))
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()


def sample_rows(n_rows: int, fraction: float, seed: int, batch_id: int) -> np.ndarray:
    """Sorted indices of the max(1, round(fraction · n_rows)) sequences used from a batch, fixed by (seed, id)."""
    take = max(1, int(round(fraction * n_rows)))
    if take >= n_rows:
        return np.arange(n_rows)
    rng = np.random.default_rng(stable_seed("rows", seed, batch_id))
    return np.sort(rng.choice(n_rows, size=take, replace=False))


def _resolve(obj: Any) -> Any:
    """ray.get an ObjectRef (lazily importing Ray); anything else passes through."""
    if type(obj).__name__ == "ObjectRef":
        import ray

        return ray.get(obj)
    return obj


class InfluenceWorker:
    """Sketches of batches (Taylor estimators) or exact look-ahead rows, at given weights.

    Args:
        model_config: transformers config dict (must hold ``model_type``), e.g.
            ``GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=512, n_positions=128).to_dict()``.
        config: the run's InfluenceConfig (same on every worker).

    Raises:
        ValueError: ``param_filter`` matches no parameter.
    """

    def __init__(self, model_config: Mapping[str, Any], config: InfluenceConfig) -> None:
        self.config = config
        if config.device == "auto":
            self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        else:
            self.device = torch.device(config.device)
        self.dtype = torch.float64 if config.dtype == "float64" else torch.float32
        self.model = build_causal_lm(model_config).to(device=self.device, dtype=self.dtype)
        for p in self.model.parameters():
            p.requires_grad_(False)
        pattern = re.compile(config.param_filter) if config.param_filter else None
        self.names = [n for n, _ in self.model.named_parameters() if pattern is None or pattern.search(n)]
        if not self.names:
            raise ValueError(f"param_filter {config.param_filter!r} matches no parameter of the model")
        if config.estimator == "lookahead" and config.dtype == "float32" and config.gamma < 1e-2:
            logger.warning(
                "lookahead in float32 with gamma=%g: loss differences this small are dominated by rounding; "
                "use gamma >= 1e-2 or dtype float64",
                config.gamma,
            )
        self.sketch = config.sketch.build()
        self._loaded_key: str | None = None
        self._cv: ControlVariate | None = None
        self.sketch_config_id = stable_seed(repr(config.sketch), config.param_filter)
        logger.info(
            "InfluenceWorker: %s, %d of %d parameter tensors (%d numbers), device %s, %s",
            config.estimator,
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
        """Copy a snapshot into the model (skipped when the same ObjectRef was loaded last).

        Args:
            weights: name → array (numpy or torch, any float dtype: ZeRO-3 gathered bf16/fp16 is cast),
                or a list of ObjectRefs to such dicts (merged; list-wrapped so Ray does not resolve it).
                A leading ``module.`` is stripped; a tied weight (GPT-2's lm_head) may be absent.

        Raises:
            ValueError: a model tensor is missing or has another shape, or the snapshot has unknown keys.
        """
        if isinstance(weights, Mapping):
            key, state = None, weights
        else:
            refs = list(weights)
            # Only ObjectRefs name an immutable snapshot; anything else is loaded every time.
            is_ref = all(type(r).__name__ == "ObjectRef" for r in refs)
            key = ",".join(r.hex() for r in refs) if is_ref and refs else None
            if key is not None and key == self._loaded_key:
                return
            state = {}
            for part in refs:
                state.update(_resolve(part))
        if state and all(k.startswith("module.") for k in state):
            state = {k[len("module.") :]: v for k, v in state.items()}
        own = self.model.state_dict(keep_vars=True)
        groups: dict[int, list[str]] = {}
        for name, tensor in own.items():
            groups.setdefault(tensor.data_ptr(), []).append(name)
        unexpected = sorted(k for k in state if k not in own and not _OPTIONAL_KEYS.search(k))
        if unexpected:
            raise ValueError(
                f"weights have keys the model does not: {unexpected[:5]} ({len(unexpected)} in all)"
            )
        with torch.no_grad():
            for names in groups.values():
                present = [n for n in names if n in state]
                if not present:
                    if all(_OPTIONAL_KEYS.search(n) for n in names):
                        continue
                    raise ValueError(f"weights lack {names[0]!r} (and its tied names {names[1:]})")
                raw = state[present[0]]
                # np.array copies: arrays from ray.get are read-only and torch wants writable memory.
                value = raw if torch.is_tensor(raw) else torch.from_numpy(np.array(raw))
                target = own[names[0]]
                if tuple(value.shape) != tuple(target.shape):
                    raise ValueError(
                        f"weights {present[0]!r} have shape {tuple(value.shape)}, model {tuple(target.shape)}"
                    )
                target.copy_(value.to(device=target.device, dtype=target.dtype))
        self._loaded_key = key

    # ---- batches -------------------------------------------------------------------------------
    def _objective(self, batch: Any, batch_id: int) -> CrossEntropyObjective:
        """The loss of the sampled sequences of one batch: ndarray ids, (ids, labels) or {input_ids, labels}."""
        batch = _resolve(batch)
        if isinstance(batch, Mapping):
            ids, labels = batch["input_ids"], batch.get("labels")
        elif isinstance(batch, (tuple, list)):
            ids, labels = batch
        else:
            ids, labels = batch, None
        ids = np.asarray(ids)
        if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(
                f"batch {batch_id}: token ids must be an int (b, T) array, got {ids.dtype} {ids.shape}"
            )
        rows = sample_rows(ids.shape[0], self.config.sample_fraction, self.config.seed, batch_id)
        input_ids = torch.as_tensor(ids[rows], dtype=torch.int64, device=self.device)  # (b', T)
        if labels is None:
            targets = input_ids[:, 1:]
        else:
            targets = torch.as_tensor(np.asarray(labels)[rows], dtype=torch.int64, device=self.device)[:, 1:]
        return CrossEntropyObjective(logits_fn=self._logits, inputs=input_ids, labels=targets)

    def _logits(self, params: Params, input_ids: torch.Tensor) -> torch.Tensor:
        """(b, T−1, V) next-token logits; parameters not in ``params`` are the model's (frozen) ones."""
        return functional_call(self.model, params, (input_ids,)).logits[:, :-1]

    def _leaves(self) -> Params:
        named = dict(self.model.named_parameters())
        return {n: named[n].detach().requires_grad_(True) for n in self.names}

    def _generator(self, batch_id: int) -> torch.Generator:
        gen = torch.Generator(device=self.device)
        gen.manual_seed(stable_seed("probes", self.config.seed, batch_id))
        return gen

    def _statistics(self, objective: CrossEntropyObjective, batch_id: int) -> BatchStatistics:
        cfg = self.config
        return batch_statistics(
            objective,
            self._leaves(),
            cfg.estimator,
            self._generator(batch_id),
            hutchinson_probes=cfg.hutchinson_probes,
            gnb_samples=cfg.gnb_samples,
            fisher_chunk=cfg.fisher_chunk,
        )

    @staticmethod
    def _vectors(st: BatchStatistics) -> dict[str, dict[str, torch.Tensor]]:
        """statistic → name → (1, *shape): g, q = g ⊙ g and h (when the estimator has one)."""
        out = {"g": {n: t.unsqueeze(0) for n, t in st.grad.items()}}
        if st.hdiag is not None:
            out["q"] = {n: (t * t).unsqueeze(0) for n, t in st.grad.items()}
            out["h"] = {n: t.unsqueeze(0) for n, t in st.hdiag.items()}
        return out

    def _control_variate(self, reference: Reference) -> ControlVariate:
        if self._cv is None or self._cv.reference_id != reference.reference_id:
            self._cv = ControlVariate(reference, self.sketch, self.device, self.dtype)
        return self._cv

    def sketch_batches(
        self,
        weights: Sequence[Any] | Mapping[str, Any],
        batches: Sequence[Any],
        batch_ids: Sequence[int],
        reference: Reference | Sequence[Any] | None = None,
        return_means: bool = False,
    ) -> BatchSketches:
        """Rows P g, P(g ⊙ g), P h of each batch (Taylor estimators: all but ``lookahead``).

        Args:
            weights: snapshot (see :meth:`load_weights`).
            batches: per batch an int (b, T) array of token ids (labels = ids, causal LM mean loss), an
                (ids, labels) pair with −100 for unscored positions, or {"input_ids", "labels"}; each may
                be an ObjectRef.
            batch_ids: ids of the batches (seed the per-batch draws; key the rows when merging).
            reference: control-variate reference shared by all workers of the chunk (or a list holding
                an ObjectRef to one). With ``config.control_variate`` and no reference, the mean of
                this call's batches is used: right when one call covers the chunk; with several
                workers pass a common reference, or the merge refuses the parts.
            return_means: also return full-dimension means of g, q, h (for the next reference).

        Returns:
            BatchSketches with rows in ``batch_ids`` order; k' = k (+3 with the control variate).
        """
        cfg = self.config
        if cfg.estimator == "lookahead":
            raise ValueError("the lookahead estimator has no sketches; call lookahead_matrix")
        if len(batches) != len(batch_ids):
            raise ValueError(f"{len(batches)} batches but {len(batch_ids)} batch ids")
        start = time.perf_counter()
        self.load_weights(weights)
        t_load = time.perf_counter() - start
        ref = (
            None
            if reference is None
            else _resolve(reference[0] if isinstance(reference, Sequence) else reference)
        )
        # Without a given reference the control variate needs this call's mean first: keep the stats.
        deferred = cfg.control_variate and ref is None
        cv = self._control_variate(ref) if cfg.control_variate and ref is not None else None
        stats_sec = sketch_sec = 0.0
        rows: dict[int, dict[str, torch.Tensor]] = {}
        pending: dict[int, BatchStatistics] = {}
        sums: dict[str, dict[str, torch.Tensor]] = {}
        losses, excluded = [], []
        for r, (batch, bid) in enumerate(zip(batches, batch_ids, strict=True)):
            t0 = time.perf_counter()
            st = self._statistics(self._objective(batch, bid), bid)
            stats_sec += time.perf_counter() - t0
            losses.append(st.loss)
            if not st.finite:
                excluded.append(bid)
                logger.warning("influence: batch %s has a non-finite loss or gradient; excluded", bid)
                continue
            vecs = self._vectors(st)
            if return_means or deferred:
                for stat, named in vecs.items():
                    acc = sums.setdefault(stat, {})
                    for n, t in named.items():
                        acc[n] = acc[n] + t[0] if n in acc else t[0].clone()
            if deferred:
                pending[r] = st
                continue
            t0 = time.perf_counter()
            rows[r] = self._rows(vecs, cv)
            sketch_sec += time.perf_counter() - t0
        n_finite = len(batch_ids) - len(excluded)
        means = None
        if sums:
            means = Reference(
                vectors={s: {n: (t / n_finite).cpu().numpy() for n, t in v.items()} for s, v in sums.items()},
                count=n_finite,
            )
        if pending:
            t0 = time.perf_counter()
            cv = self._control_variate(means)
            for r, st in pending.items():
                rows[r] = self._rows(self._vectors(st), cv)
            sketch_sec += time.perf_counter() - t0
        width = self.sketch.dim({n: p.numel() for n, p in self.model.named_parameters() if n in self.names})
        width += EXTRA_COLUMNS if cfg.control_variate else 0
        out_dtype = np.float64 if self.dtype == torch.float64 else np.float32
        mats = {s: np.zeros((len(batch_ids), width), dtype=out_dtype) for s in ("g", "q", "h")}
        for r, row in rows.items():
            for stat, vec in row.items():
                mats[stat][r] = vec.detach().cpu().numpy()
        ref_id = cv.reference_id if cv is not None else "none"
        total = time.perf_counter() - start
        return BatchSketches(
            batch_ids=list(batch_ids),
            G=mats["g"],
            Q=mats["q"],
            H=mats["h"],
            losses=np.asarray(losses, dtype=np.float64),
            excluded=excluded,
            timings={
                "influence/load_sec": t_load,
                "influence/stats_sec": stats_sec,
                "influence/sketch_sec": sketch_sec,
                "influence/total_sec": total,
            },
            estimator=cfg.estimator,
            sketch_id=f"{self.sketch_config_id}:{ref_id}",
            means=means if return_means else None,
        )

    def _rows(
        self, vecs: dict[str, dict[str, torch.Tensor]], cv: ControlVariate | None
    ) -> dict[str, torch.Tensor]:
        """statistic → (k',) sketch row of one batch, with the control variate when one is given."""
        stats = list(vecs)
        # One projection of the stacked statistics: the rows/signs of each parameter are looked up once.
        stacked = {
            n: torch.cat([vecs[s][n] for s in stats]) for n in vecs["g"]
        }  # name → (len(stats), *shape)
        projected = self.sketch.project(stacked)  # (len(stats), k)
        sketches = {s: projected[i : i + 1] for i, s in enumerate(stats)}  # stat → (1, k)
        if self.config.control_variate:
            if cv is not None:
                sketches = cv.augment(vecs, sketches)
            else:  # no usable reference: zero extra columns keep the width equal across workers
                sketches = {s: torch.nn.functional.pad(t, (0, EXTRA_COLUMNS)) for s, t in sketches.items()}
        return {stat: t[0] for stat, t in sketches.items()}

    def lookahead_matrix(
        self,
        weights: Sequence[Any] | Mapping[str, Any],
        batches: Sequence[Any],
        batch_ids: Sequence[int],
        gamma: float | None = None,
        rows: Sequence[int] | None = None,
    ) -> LookaheadRows:
        """Exact look-ahead rows I[i → j] = ℓ(B_j; θ − γ g_i) − ℓ(B_j; θ) (``lookahead`` estimator).

        Every worker needs all L batches of the chunk (they are the columns); the rows i may be split
        across workers with ``rows`` and merged with
        :func:`~d3ray.influence.influence.influence_from_lookahead`.

        Args:
            weights: snapshot (see :meth:`load_weights`).
            batches, batch_ids: all L batches of the chunk and their ids.
            gamma: step γ (default ``config.gamma``); here γ changes the result, not only its scale.
            rows: ids of the batches i to compute (default all).
        """
        start = time.perf_counter()
        self.load_weights(weights)
        gamma = self.config.gamma if gamma is None else gamma
        row_ids = list(batch_ids) if rows is None else list(rows)
        pos = {b: t for t, b in enumerate(batch_ids)}
        objectives = [self._objective(b, bid) for b, bid in zip(batches, batch_ids, strict=True)]
        A_rows, base, row_finite = lookahead_influence(
            objectives, self._leaves(), gamma, [pos[b] for b in row_ids]
        )
        losses = base.detach().cpu().numpy().astype(np.float64)
        excluded = [b for b, loss in zip(batch_ids, losses, strict=True) if not np.isfinite(loss)]
        excluded += [
            b for b, ok in zip(row_ids, row_finite.tolist(), strict=True) if not ok and b not in excluded
        ]
        return LookaheadRows(
            batch_ids=list(batch_ids),
            row_ids=row_ids,
            A_rows=A_rows.detach().cpu().numpy().astype(np.float64),
            losses=losses,
            excluded=excluded,
            timings={"influence/total_sec": time.perf_counter() - start},
        )
