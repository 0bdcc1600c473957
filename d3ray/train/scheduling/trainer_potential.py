"""In-trainer drift potential: the trainer ranks compute a chunk's exact potential f themselves (ZeRO 0-2).

``schedule.placement: {type: in_trainer}`` with the potential alone (``drift``, ``residual: none``,
``potential: step | jvp``, the AdamW preconditioner: ``InfluenceConfig.potential_alone``) and a ZeRO stage
that keeps whole parameters on every rank. Where the influence actor shares the trainers' cores (a CPU box,
or a GPU that is all the trainers'), its work lands on one rank, and the lock-step ranks all wait for that
one at the next all-reduce: the pair loses about twice what the actor takes (README.md, "Benchmarks").
Here every rank does an equal share, in step with the others, and no weights snapshot is published:

    w = λθ + β1·m ⊘ (b1·d₀), eq. P1 (influence/drift.py), whole on every rank: under ZeRO-1/2 each rank
    computes it on its own partition of the AdamW state and an asynchronous all-reduce sums the fragments
    (train/scheduling/snapshot.py: ``gathered_drift``); ZeRO-0 reads its state whole (``full_optimizer_state``)
        │
        ▼
    rank r: batches r, r + W, ... of the chunk, their sampled sequences (``sampled_objective``, as the
    actors sample them), f_i = (ℓ_i(θ) − ℓ_i(θ − η·w)) / η in batched forwards, those at θ while w is
    still crossing the ranks                                                    eq. P2, ``potential: step``
        │ (``chunk.potential_chunk``, the actors' function, on the trainers' own module)
        ▼
    one all-reduce of (ℓ_i, f_i, excluded_i) over the ranks → the chunk's BatchSketches on every rank;
    rank 0 hands f to the coordinator, which sorts it (trainer_side.sketch_due_chunks)

The forwards run at float32 whatever the module's dtype (a bf16 module is read as float32 copies): θ − η·w
moves each weight by about η relative to it, below bfloat16's resolution. The module is put in eval mode
for the passes (no dropout) and back after; nothing the optimizer owns is touched.

Under ZeRO-3 no rank holds whole parameters: the shards' scorer (``sharded_influence.ShardedScorer``)
computes f from gradient slices there.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from d3ray import faults
from d3ray.influence.chunk import parameter_names, potential_chunk
from d3ray.influence.config import InfluenceConfig
from d3ray.influence.influence import BatchSketches
from d3ray.influence.statistics import Params
from d3ray.influence.worker import causal_logits, sampled_objective, takes_logits_to_keep
from d3ray.train.collectives import all_reduce_sum
from d3ray.train.trainer_rank import TrainerRank

__all__ = ["TrainerPotential"]


class TrainerPotential:
    """The exact drift potential of a chunk on the trainers' own module (see the module docstring); every
    rank calls :meth:`score` with the same batches, in the same order.

    Args:
        trainer: this rank (its DeepSpeed engine, ZeRO 0-2; the ZeRO stage says how the optimizer state
            is assembled).
        config: the run's InfluenceConfig (same on every rank); ``potential_alone`` must hold.
        run_dir: the run directory, or None (the ``sketch_batch`` fault drill acts through ``faults.inject``).

    Raises:
        ValueError: ZeRO-3, a config that is not the potential alone, or a ``param_filter`` that matches nothing.
    """

    def __init__(self, trainer: TrainerRank, config: InfluenceConfig, run_dir: str | None = None) -> None:
        if trainer.zero_stage == 3:
            raise ValueError("TrainerPotential needs whole parameters on every rank (ZeRO 0-2); ZeRO-3 scores "
                             "on the shards (sharded_influence.ShardedScorer)")
        if not config.potential_alone:
            raise ValueError(f"TrainerPotential computes the drift potential alone, not {config.estimator.describe()}")
        self.trainer, self.config, self.run_dir = trainer, config, run_dir
        self.rank, self.world = trainer.rank, trainer.world
        self.module = trainer.engine.module
        trainable = [n for n, p in self.module.named_parameters() if p.requires_grad]
        self.names = parameter_names(trainable, config.param_filter)
        if not self.names:
            raise ValueError(f"param_filter {config.param_filter!r} matches no trainable parameter")
        self._keeps_logits = takes_logits_to_keep(self.module)

    def score(self, chunk_id: int, batches: Sequence[Any], batch_ids: Sequence[int]) -> BatchSketches:
        """The chunk's BatchSketches (zero-width rows, ``potential`` f, the losses; the same on every rank).

        Args:
            chunk_id: the chunk (for the fault drills and the log).
            batches: the chunk's ``GlobalBatch`` objects, in chunk order.
            batch_ids: their global batch ids.
        """
        from d3ray.data.labels import lm_labels
        from d3ray.train.scheduling.snapshot import full_optimizer_state, gathered_drift

        start = time.perf_counter()
        gathered = gathered_drift(self.trainer)  # a collective: every rank, every chunk (w still crossing)
        state, drift = gathered if gathered is not None else (full_optimizer_state(self.trainer), None)
        named = dict(self.module.named_parameters())
        params = {n: named[n].detach().to(torch.float32) for n in self.names}
        # the parameters f does not move, as float32 copies where the module holds another dtype
        others = {n: p.detach().to(torch.float32) for n, p in named.items() if n not in params and p.dtype != torch.float32}

        def logits(p: Params, input_ids: torch.Tensor) -> torch.Tensor:  # one function for every batch's passes
            return causal_logits(self.module, {**others, **p}, input_ids, self._keeps_logits)

        device = next(iter(params.values())).device
        mine = list(range(self.rank, len(batch_ids), self.world))  # rank r: batches r, r + W, ...
        objectives = []
        for position in mine:
            batch, bid = batches[position], batch_ids[position]
            ids = np.asarray(batch.input_ids, dtype=np.int64)
            labels = lm_labels(ids, batch.n_tokens, batch.loss_mask)
            faults.inject(self.run_dir, "sketch_batch", rank=self.rank, chunk_id=chunk_id, position=position,
                          batch_id=bid, labels=labels)
            objectives.append(sampled_objective(ids, labels, self.config, bid, logits, device))
        was_training = self.module.training
        self.module.eval()
        try:
            part = (potential_chunk(objectives, [batch_ids[i] for i in mine], params, self.config, state, drift)
                    if mine else None)
        finally:
            self.module.train(was_training)
        if drift is not None:
            drift()  # a rank with no batch of the chunk waits for its part of w's all-reduce all the same
        # (ℓ, f, excluded) of every batch: each rank fills its own columns, the sum is the chunk's
        numbers = torch.zeros(3, len(batch_ids), dtype=torch.float64)
        if part is not None:
            numbers[0, mine] = torch.as_tensor(part.losses, dtype=torch.float64)
            numbers[1, mine] = torch.as_tensor(part.potential, dtype=torch.float64)
            numbers[2, mine] = torch.as_tensor([float(b in part.excluded) for b in part.batch_ids], dtype=torch.float64)
        total = all_reduce_sum(numbers).numpy()
        excluded = [int(b) for b, flag in zip(batch_ids, total[2], strict=True) if flag]
        empty = np.zeros((len(batch_ids), 0), dtype=np.float64 if self.config.dtype == "float64" else np.float32)
        seconds = time.perf_counter() - start
        return BatchSketches(
            batch_ids=list(batch_ids), G=empty, Q=None, H=None, U=empty.copy(), step_size=float(state.lr),
            losses=total[0], excluded=excluded, potential=total[1], estimator=self.config.estimator.describe(),
            sketch_id="in_trainer:potential",
            timings={"influence/stats_sec": seconds, "influence/sketch_sec": 0.0, "influence/total_sec": seconds})

    # ---- checkpoint (nothing to keep: f depends only on the weights and the optimizer state) ----------
    def save(self, directory: Path) -> None:
        """Nothing: the potential keeps no state between chunks (a resumed run scores as an uninterrupted one)."""

    def load(self, directory: Path) -> None:
        """Nothing to restore (see :meth:`save`)."""
