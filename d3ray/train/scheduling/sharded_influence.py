"""In-trainer influence: the trainer ranks sketch a chunk on their own ZeRO-3 shards.

``schedule.placement: {type: in_trainer}`` (D3, a ``SketchRequest``). This module is the engine (the
math on the shards); d3ray/train/scheduling/trainer_side.py decides when, asks the coordinator for the chunk and
hands it the S. Between chunks, every trainer rank scores the chunk the coordinator asks for, and no
process ever holds the full weights or a full gradient:

    a pass: the sampled sequences (sample_rows, as the influence actors) of one batch split over the W
    ranks, or of up to W batches, one a rank, when a batch has fewer sampled rows than there are ranks
        │ forward + backward on the ZeRO-3 module (DeepSpeed gathers one layer's weights at a time)
        │ per parameter, as soon as autograd has its gradient: into a bucket that is exchanged by an
        │ all-to-all (one collective per 4M numbers; each rank sums its slices of the ranks that ran the
        │ same batch) → this rank's slice of each batch's gradient (autograd keeps only a zero view: the
        │ hook replaces the gradient it returns)
        ▼
    g slice, θ slice, AdamW m / v slices (the optimizer's own partition) ─► u, q = u ⊙ u slices
        │ sketch_chunk(..., shards=Shards(offsets, all_reduce))      d3ray/influence/shards.py
        ▼
    P g_i, P u_i, ... : (stats, k) summed over ranks (one all-reduce per batch); rank 0 merges them
    into the chunk's S (ChunkInfluence: L² numbers) for the coordinator; nothing else leaves a rank

No process holds the full weights; a full-size gradient exists only one bucket at a time.

Why ``torch.autograd.grad`` with tensor hooks and not ``engine.backward``: DeepSpeed's own gradient
hooks (``register_post_accumulate_grad_hook``) fire only when a gradient is accumulated into
``.grad``, i.e. in training; ``autograd.grad`` leaves the optimizer's gradient partitions, its
micro-step counters and the loss scaler untouched, so scoring cannot change training. The module's
ZeRO-3 gather/release hooks still run; ``engine.optimizer.empty_partition_cache()`` releases what the skipped
end-of-backward epilogue would have.

Estimators: ``drift`` (the default: one backward and, per batch, the exact potential f_i = ⟨g_i, w⟩ as
one scalar all-reduce of the slices' dot products with this rank's slice of the drift w; with the
default ``residual: none`` nothing is sketched, the rows are zero-width and only f leaves a rank;
``residual: sketch`` adds the sketched residual) and ``first_order`` (one backward; with the AdamW
preconditioner it carries the order, d3ray/influence/README.md). Not supported here, and why: ``hutchinson`` needs a double
backward through ZeRO-3's gather hooks; ``fisher`` needs per-sequence gradients, which the
reduce-scatter sums across ranks (W backwards per sequence to separate them); ``gnb`` draws labels
from the softmax of the whole sampled batch in one random stream, which the ranks cannot replay on
their own rows (it would need per-row streams: a different estimator than the actors'); the exact
``lookahead`` takes steps on full weights.

Control variate: chunk c uses the mean directions of chunk c − 1 as scored here (each rank keeps its
slices; :meth:`ShardedScorer.state_dict` goes into the rank's checkpoint so a resumed run sketches
as an uninterrupted one); the first chunk has none (zero extra columns).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from d3ray import faults
from d3ray.influence.chunk import parameter_names, sketch_chunk
from d3ray.influence.config import InfluenceConfig
from d3ray.influence.influence import BatchSketches, Reference
from d3ray.influence.optimizer import AdamWState
from d3ray.influence.shards import Shards
from d3ray.influence.statistics import IGNORE_INDEX, BatchStatistics
from d3ray.train.collectives import all_reduce_sum, collective_device
from d3ray.train.trainer_rank import TrainerRank

logger = logging.getLogger(__name__)

__all__ = ["ShardedScorer"]


class _GradientBuckets:
    """Per-parameter gradients (as autograd produces them) → this rank's slices, exchanged a bucket at a
    time: one collective per ``bucket_numel`` gradient numbers instead of one per parameter (the latency
    of ~28 small collectives per batch doubled the cost of a tiny model's scoring), holding at most one
    bucket of full-size gradients.

    The exchange is an all-to-all: rank r receives its slice of every rank's gradient, then sums the
    slices of ranks that worked on the same batch (``groups[rank]``: the pass's batch each rank ran). One
    batch over all ranks is a reduce-scatter; W batches in one pass, one per rank, keep W gradients apart.
    """

    def __init__(self, partition: dict[str, int], valid: dict[str, int], world: int, bucket_numel: int,
                 groups: list[int]) -> None:
        self.partition, self.valid, self.world, self.bucket_numel = partition, valid, world, bucket_numel
        self.groups = groups
        self.pending: list[tuple[str, torch.Tensor]] = []
        self.size = 0
        self.slices: dict[int, dict[str, torch.Tensor]] = {g: {} for g in set(groups)}

    def add(self, name: str, grad: torch.Tensor) -> None:
        self.pending.append((name, grad.reshape(-1).to(torch.float32)))
        self.size += grad.numel()
        if self.size >= self.bucket_numel:
            self.flush()

    def flush(self) -> None:
        """Exchange the pending gradients (every rank flushes at the same points: the same parameters
        reach the hooks in the same order on every rank)."""
        import torch.distributed as dist

        if not self.pending:
            return
        # Rank-major: row r holds every pending parameter's r-th slice (ZeRO-3's partitioning, the
        # last slice zero-padded), so the all-to-all hands rank r every rank's r-th slices.
        rows = []
        for name, flat in self.pending:
            m = self.partition[name]
            padded = flat.new_zeros(m * self.world)
            padded[: flat.numel()] = flat
            rows.append(padded.view(self.world, m))
        stacked = torch.cat(rows, dim=1).to(collective_device())  # (W, Σ m), where the group exchanges
        received = torch.empty_like(stacked)
        dist.all_to_all_single(received, stacked)  # received[j]: my slices of rank j's gradient
        received = received.to(self.pending[0][1].device)
        for group in self.slices:
            mine = received[[j for j, g in enumerate(self.groups) if g == group]].sum(dim=0)
            start = 0
            for name, _ in self.pending:
                self.slices[group][name] = mine[start : start + self.valid[name]]
                start += self.partition[name]
        self.pending, self.size = [], 0


class ShardedScorer:
    """Sketches chunks on this rank's ZeRO-3 shards (see the module docstring); every rank calls
    :meth:`score` with the same batches, in the same order.

    Args:
        trainer: this rank (its DeepSpeed engine: ZeRO-3).
        config: the run's InfluenceConfig (same on every rank).
        keep_means: how many chunks' mean directions to keep. 2 covers a resume: a rank restored from
            a checkpoint re-sketches at most the last chunk it had sketched, whose reference is the
            chunk before.
        run_dir: the run directory, or None: the fault drills act through
            ``faults.inject(run_dir, "sketch_batch", ...)`` before each batch (d3ray/faults.py).
        bucket_numel: gradient numbers exchanged per collective (the most full-size gradient
            numbers a rank holds at once: a model smaller than this holds its whole gradient briefly).

    Raises:
        ValueError: an unsupported estimator or sketch, a parameter that is not ZeRO-3 partitioned,
            or a ``param_filter`` that matches nothing.
    """

    def __init__(self, trainer: TrainerRank, config: InfluenceConfig, keep_means: int = 2,
                 run_dir: str | None = None, bucket_numel: int = 1 << 22) -> None:
        config.check_shardable()
        engine, rank = trainer.engine, trainer.rank
        self.engine, self.config, self.rank, self.world = engine, config, rank, trainer.world
        self.keep_means = max(1, keep_means)
        self.bucket_numel = bucket_numel
        self.run_dir = run_dir
        named = [(n, p) for n, p in engine.module.named_parameters() if p.requires_grad]
        names = parameter_names([n for n, _ in named], config.param_filter)
        if not names:
            raise ValueError(f"param_filter {config.param_filter!r} matches no trainable parameter")
        self.params = {n: p for n, p in named if n in set(names)}
        unpartitioned = [n for n, p in self.params.items() if not hasattr(p, "ds_tensor")]
        if unpartitioned:
            raise ValueError(f"in-trainer influence needs ZeRO-3 partitioned parameters; {unpartitioned[:3]} are not")
        # ZeRO-3 gives rank r elements [r·m, (r+1)·m) of each flattened parameter (m = partition size,
        # the last rank's slice padded): the offsets of the sketch and the valid length of the slice.
        self.partition = {n: int(p.ds_tensor.ds_numel) for n, p in self.params.items()}
        self.valid = {n: max(0, min(m, int(self.params[n].ds_numel) - rank * m)) for n, m in self.partition.items()}
        self.shards = Shards(offsets={n: rank * m for n, m in self.partition.items()}, reduce=all_reduce_sum)
        self.sketch = config.sketch.build()
        self.means: dict[int, Reference] = {}
        self.device = next(iter(self.params.values())).ds_tensor.device

    # ---- this rank's slices -------------------------------------------------------------------
    def _slice(self, name: str, flat: torch.Tensor) -> torch.Tensor:
        return flat.reshape(-1)[: self.valid[name]].detach().to(torch.float32).clone()

    def local_state(self) -> tuple[dict[str, torch.Tensor], AdamWState | None]:
        """(θ slices, AdamW state of the slices or None): the optimizer's fp32 partitions, no gather."""
        from deepspeed.utils import safe_get_local_fp32_param, safe_get_local_optimizer_state

        from d3ray.train.scheduling.snapshot import (
            adamw_hyperparameters,
            adamw_started,
            adamw_step,
            base_optimizer,
        )

        theta = {n: self._slice(n, safe_get_local_fp32_param(p)) for n, p in self.params.items()}
        if not self.config.needs_optimizer_state:
            return theta, None
        base = base_optimizer(self.engine)
        hyper = adamw_hyperparameters(self.engine)
        if not adamw_started(base):  # the same on every rank: they step together
            return theta, AdamWState.fresh({n: (v,) for n, v in self.valid.items()}, **hyper)
        # fp32 tensors where the optimizer keeps them (a GPU's): AdamWState takes tensors, no host copy.
        m = {n: self._slice(n, safe_get_local_optimizer_state(p, "exp_avg")) for n, p in self.params.items()}
        v = {n: self._slice(n, safe_get_local_optimizer_state(p, "exp_avg_sq")) for n, p in self.params.items()}
        return theta, AdamWState(step=adamw_step(base), exp_avg=m, exp_avg_sq=v, **hyper)

    def gradient_slices(self, batches: Sequence[tuple[np.ndarray, np.ndarray]]) -> list[BatchStatistics]:
        """Losses and this rank's slices of the gradients of up to W batches' mean token losses, in one pass.

        Args:
            batches: per batch its sampled sequences (input_ids, labels), (b', T) each (every rank passes
                the same). Rank r runs batch r mod n, sharing its rows with the other ranks of that batch
                (one batch: rank r runs rows r, r + W, ...; W batches: each rank one batch whole); the
                exchange sums each batch's shares and keeps the batches apart. A rank with no row runs one
                row with weight 0, because every rank must take part in the same gathers and exchanges.

        Returns:
            One BatchStatistics per batch, in order (``loss`` and ``finite`` the same on every rank).
        """
        import torch.nn.functional as F

        n = len(batches)
        if not 1 <= n <= self.world:
            raise ValueError(f"a pass scores 1 to {self.world} batches, got {n}")
        targets = [np.asarray(labels)[:, 1:] for _, labels in batches]
        scored = [int((t != IGNORE_INDEX).sum()) for t in targets]  # a batch's mean's denominator, all its rows
        groups = [r % n for r in range(self.world)]  # rank r runs batch r mod n, with the other ranks of its group
        mine = groups[self.rank]
        members = [r for r in range(self.world) if groups[r] == mine]
        rows = list(range(members.index(self.rank), batches[mine][0].shape[0], len(members)))
        weight = 1.0 if rows else 0.0
        rows = rows or [0]
        ids = torch.as_tensor(np.asarray(batches[mine][0])[rows], dtype=torch.int64, device=self.device)
        y = torch.as_tensor(targets[mine][rows], dtype=torch.int64, device=self.device)
        # The labels shift, not the logits (as d3ray/model/lm_loss.py): no copy of the pass's largest tensor in
        # the forward or the backward; the last position predicts nothing (an ignored target).
        logits = self.engine.module(input_ids=ids).logits
        logits = logits if logits.dtype == torch.float32 else logits.float()
        target = F.pad(y, (0, 1), value=IGNORE_INDEX)
        loss_sum = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                                   ignore_index=IGNORE_INDEX, reduction="sum") * weight
        # Like the unsharded mean over zero scored tokens (a masked batch): NaN, so the batch is excluded.
        local = loss_sum * (1.0 / scored[mine] if scored[mine] else float("nan"))
        buckets = _GradientBuckets(self.partition, self.valid, self.world, self.bucket_numel, groups)

        def hook(name: str):
            def exchange(grad: torch.Tensor) -> torch.Tensor:
                buckets.add(name, grad)
                return grad.new_zeros(()).expand(grad.shape)  # autograd keeps a view of one zero, not the gradient

            return exchange

        handles = [p.register_hook(hook(n)) for n, p in self.params.items()]
        try:
            torch.autograd.grad(local, list(self.params.values()), allow_unused=True)
            buckets.flush()
        finally:
            for h in handles:
                h.remove()
            # What the skipped end-of-backward epilogue would release (the engine's own method of this
            # name also runs gc.collect(): 0.6 s a call on CPU).
            self.engine.optimizer.empty_partition_cache()
        # per batch: the loss (its ranks' shares summed) and whether any rank's slice of it is not finite
        losses = torch.zeros(n, dtype=torch.float64)
        if weight:
            losses[mine] = float(local.detach())
        bad = torch.zeros(n, dtype=torch.float64)
        out_grads = []
        for b in range(n):
            grads = {name: buckets.slices[b].get(name, torch.zeros(self.valid[name], device=self.device))
                     for name in self.params}
            bad[b] = float(any(bool((~torch.isfinite(g)).any()) for g in grads.values()))
            out_grads.append(grads)
        totals = all_reduce_sum(torch.cat([losses, bad]))
        return [BatchStatistics(loss=float(totals[b]), grad=out_grads[b], hdiag=None,
                                finite=float(totals[n + b]) == 0.0 and bool(np.isfinite(float(totals[b]))))
                for b in range(n)]

    # ---- a chunk ------------------------------------------------------------------------------
    def _statistics(self, chunk_id: int, batches: Sequence[Any], batch_ids: Sequence[int]) -> Iterator[BatchStatistics]:
        from d3ray.data.labels import lm_labels
        from d3ray.influence.worker import sample_rows

        sampled = []
        for position, (batch, bid) in enumerate(zip(batches, batch_ids, strict=True)):
            ids = np.asarray(batch.input_ids, dtype=np.int64)
            labels = lm_labels(ids, batch.n_tokens, batch.loss_mask)
            faults.inject(self.run_dir, "sketch_batch", rank=self.rank, chunk_id=chunk_id, position=position,
                          batch_id=bid, labels=labels)
            rows = sample_rows(ids.shape[0], self.config.sample_fraction, self.config.seed, bid)
            sampled.append((ids[rows], labels[rows]))
            # a pass: batches until every rank has a row (or one batch per rank): fewer sampled rows than
            # ranks would leave ranks running weight-0 rows
            if (len(sampled) == self.world or sum(len(ids) for ids, _ in sampled) >= self.world
                    or position == len(batches) - 1):
                yield from self.gradient_slices(sampled)
                sampled = []

    def score(self, chunk_id: int, batches: Sequence[Any], batch_ids: Sequence[int]) -> BatchSketches:
        """The chunk's sketches (every rank gets the same rows; rank 0 ships them).

        Args:
            chunk_id: the chunk (its control-variate reference is chunk_id − 1's means, if kept).
            batches: the chunk's ``GlobalBatch`` objects, in chunk order.
            batch_ids: their global batch ids.
        """
        start = time.perf_counter()
        reference = self.means.get(chunk_id - 1) if self.config.control_variate else None
        theta, optimizer = self.local_state()
        module = self.engine.module
        was_training = module.training
        module.eval()
        try:
            out = sketch_chunk(self._statistics(chunk_id, batches, batch_ids), batch_ids, theta, self.config, self.sketch,
                               reference=reference, return_means=self.config.control_variate,
                               optimizer=optimizer, shards=self.shards)
        finally:
            module.train(was_training)
        if out.means is not None:
            self.means[chunk_id] = out.means
            for old in [c for c in self.means if c <= chunk_id - self.keep_means]:
                del self.means[old]
        out.timings["influence/total_sec"] = time.perf_counter() - start
        return dataclasses.replace(out, means=None)

    # ---- checkpoint ---------------------------------------------------------------------------
    def state_dict(self) -> dict[int, Reference]:
        """This rank's kept mean directions (its slices), by chunk id."""
        return dict(self.means)

    def load_state_dict(self, state: dict[int, Reference]) -> None:
        self.means = {int(c): ref for c, ref in state.items()}

    def save(self, directory: Path) -> None:
        """Write this rank's kept means into a checkpoint directory (``influence_means_rank<r>.pt``)."""
        torch.save(self.state_dict(), Path(directory) / f"influence_means_rank{self.rank}.pt")

    def load(self, directory: Path) -> None:
        """Restore this rank's means from a checkpoint directory (none kept: nothing to restore)."""
        path = Path(directory) / f"influence_means_rank{self.rank}.pt"
        if path.exists():
            from d3ray.influence.influence import Reference
            from d3ray.safe_load import load_data

            self.load_state_dict(load_data(path, allow=[Reference]))
