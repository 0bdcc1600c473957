"""The trainers' side of scheduling: what the scheduler asks of the trainers, carried out in one place.

The schedule config declares its :class:`~d3ray.schedule.scheduler.TrainerRequests`; the driver builds
them once and hands them to the coordinator (what to wait for) and to every trainer rank (what to do):

    TrainerRequests
        snapshot ─► the weights (and AdamW state) of version v, in the requested dtype: every rank takes
                    part in the ZeRO gathers (d3ray/train/scheduling/snapshot.py), rank 0 hands the refs to the coordinator
        sketch   ─► the chunks due at version v, scored by the ranks themselves: sketched on their ZeRO-3
                    shards (d3ray/train/scheduling/sharded_influence.py), or under ZeRO 0-2 the drift potential alone
                    on the whole module, each rank a share of the batches (d3ray/train/scheduling/trainer_potential.py);
                    rank 0 sends each chunk's S, or for the potential alone its L numbers f (sorted by the
                    coordinator: no S is built), to the coordinator
        feedback ─► the per-sample losses of every trained chunk, from rank 0 (one call per chunk)

Version v is the number of chunks trained: the train loop calls :meth:`TrainerSide.start` before its
first chunk (version 0 on a fresh run, the checkpoint's on a resumed one), :meth:`TrainerSide.chunk_trained`
after each chunk (feedback, then version chunk + 1), and :meth:`TrainerSide.save` / :meth:`TrainerSide.restore`
with its checkpoints (the sketcher's control-variate means, per rank).

Version 0 has one producer: trainer rank 0 publishes it before the first step, as every later version,
from the engine that trains (ZeRO-3 gathers it from the shards). The coordinator does not time the
weights deadline before the trainers first ask for a chunk, so a slow start-up is no missed deadline.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from d3ray.data.chunker import chunks_to_train
from d3ray.schedule.scheduler import ChunkFeedback, SketchRequest, SnapshotRequest, TrainerRequests
from d3ray.train.scheduling.batch_fetch import BatchFetcher
from d3ray.train.trainer_rank import TrainerRank

logger = logging.getLogger(__name__)

__all__ = ["TrainerSide", "chunk_feedback", "publish_snapshot", "sketch_due_chunks"]


def publish_snapshot(trainer: TrainerRank, coordinator: Any, version: int, request: SnapshotRequest) -> None:
    """Put the state dict (and the AdamW state if asked), in the requested dtype, in the object store
    and hand the refs and their byte size (the schedule log's ``snapshot_bytes``) to the coordinator.
    Collectives under ZeRO (d3ray/train/scheduling/snapshot.py): every rank calls."""
    import ray

    from d3ray.train.scheduling.snapshot import snapshot_nbytes, snapshot_optimizer_state, snapshot_weights

    parts = [snapshot_weights(trainer, request.dtype)]
    if request.optimizer_state:
        parts.append(snapshot_optimizer_state(trainer, request.dtype))
    if trainer.is_rank0:
        coordinator.publish_weights.remote(version, [ray.put(p) for p in parts], snapshot_nbytes(parts), request.dtype)


def sketch_due_chunks(scorer: Any, request: SketchRequest, total_chunks: int, coordinator: Any, version: int,
                      rank: int, fetcher: BatchFetcher | None) -> dict[str, float]:
    """Sketch the chunks due at weights ``version`` and hand each chunk's S to the coordinator (rank 0
    merges the sketches); every rank calls. Returns the seconds spent (trainer time, logged as such):
    ``total``, and of it ``fetch`` (the batches: rank 0's wait for them, and sharing them over the ranks)
    and ``score`` (the scorer's pass, its collectives included).

    Rank 0 takes each chunk's batches from its ``fetcher`` (None on the other ranks; fetched a boundary
    ahead by :class:`TrainerSide`, else asked of the coordinator now, ``batch_fetch.py``; None for a chunk
    restored from a checkpoint, or sketched before a rollback) and broadcasts them to the other ranks (tens
    of KiB of token ids: one Ray round trip per chunk, not one per rank); then every rank scores the same
    batches together (``scorer``: a :class:`~d3ray.train.scheduling.sharded_influence.ShardedScorer` or a
    :class:`~d3ray.train.scheduling.trainer_potential.TrainerPotential`). The potential alone leaves rank 0 as the L
    numbers f (a ``ChunkPotential``: the coordinator sorts them); anything else as the chunk's S.
    """
    import ray
    import torch.distributed as dist

    from d3ray.influence.influence import ChunkInfluence, chunk_potential

    # the potential alone (no residual sketched): its order is the sort of f (D3ScheduleConfig.sorts_potential)
    potential_only = request.influence.estimator.exact_potential and not request.influence.estimator.sketches_residual
    start = time.perf_counter()
    fetch = score = 0.0
    for chunk_id in request.due(version, total_chunks):
        t_fetch = time.perf_counter()
        work: list[Any] = [fetcher.take(chunk_id) if rank == 0 else None]
        dist.broadcast_object_list(work, src=0)
        t_score = time.perf_counter()
        fetch += t_score - t_fetch
        if work[0] is None:
            continue
        batches, batch_ids = work[0]
        sketches = scorer.score(chunk_id, batches, batch_ids)
        score += time.perf_counter() - t_score
        if rank == 0 and potential_only:  # f (L numbers) leaves the trainers; the coordinator sorts it, no S
            coordinator.publish_influence.remote(chunk_id, [ray.put(chunk_potential(sketches))])
        elif rank == 0:  # merged here: S (L² numbers) leaves the trainers, not the sketch rows
            _, S, excluded = request.influence.estimator.merge([sketches], list(batch_ids))
            influence = ChunkInfluence(batch_ids=list(batch_ids), S=S, excluded=excluded, losses=sketches.losses,
                                       timings=dict(sketches.timings))
            coordinator.publish_influence.remote(chunk_id, [ray.put(influence)])
    return {"total": time.perf_counter() - start, "fetch": fetch, "score": score}


def chunk_feedback(chunk: Any, losses: np.ndarray) -> ChunkFeedback:
    """The per-sample losses of the trained steps of ``chunk`` (a ``DecidedChunk``); ``losses``: (steps, B),
    NaN rows for the steps not trained (a run that stopped inside the chunk)."""
    trained = ~np.isnan(losses[:, 0])
    return ChunkFeedback(
        chunk_id=chunk.chunk_id,
        sample_ids=tuple(s for p, ids in enumerate(chunk.sample_ids) if trained[p] for s in ids),
        domains=tuple(d for p, ds in enumerate(chunk.domains) if trained[p] for d in ds),
        losses=losses[trained].reshape(-1))


def prepares_after_checkpoint(requests: TrainerRequests) -> bool:
    """Whether the preparation of a chunk boundary (the next version's snapshot or sketches) comes after the
    boundary's checkpoint rather than before it.

    At ``staleness >= 1`` (the trainers' own scoring, or a snapshot whose reader declares it: D3's influence
    actors) what a boundary prepares is first read for the chunk after the next, so the next chunk's
    decision, which the checkpoint waits for, was made a boundary earlier. Saving first keeps the
    preparation's work off the save: a save right after the scoring pass was slower (20 against 13 ms a
    checkpoint at L = 8, the same files), and with a trainer on a core of its own Ray Train's report took
    twice random order's beside the influence actor's pass on the snapshot just published
    (docs/results/bench-pipeline-default-d3-2026-12-05.md). A resumed run prepares at its first version
    anyway (``TrainerSide.start``). At staleness 0, or for a snapshot reader that declares none, the next
    chunk's decision needs this boundary's preparation: it comes first.
    """
    sketch, snapshot = requests.sketch, requests.snapshot
    if sketch is None and snapshot is None:
        return False
    return (sketch is None or sketch.staleness >= 1) and (snapshot is None or snapshot.staleness >= 1)


class TrainerSide:
    """One trainer rank's share of the scheduler's requests (see the module docstring).

    Args:
        requests: what the scheduler asks (``ScheduleConfig.trainer_requests()``, the same on every rank).
        trainer: this rank (its engine, rank, world and ZeRO stage: how a snapshot is gathered).
        coordinator: the ScheduleCoordinator actor handle.
        steps: ``train.steps`` (with the sketch request's L: the chunks the run trains; later ones are never sketched).
        run_dir: the run directory, or None (the sketcher's fault drills act through ``d3ray.faults.inject``).
    """

    def __init__(self, requests: TrainerRequests, trainer: TrainerRank, coordinator: Any, steps: int,
                 run_dir: str | None = None) -> None:
        self.requests, self.trainer, self.coordinator, self.steps = requests, trainer, coordinator, steps
        self.rank = trainer.rank
        self.logs: Any = None
        self.scorer = None
        if requests.sketch is not None and trainer.zero_stage < 3:  # whole parameters: the potential on the module
            from d3ray.train.scheduling.trainer_potential import TrainerPotential

            self.scorer = TrainerPotential(trainer, requests.sketch.influence, run_dir=run_dir)
        elif requests.sketch is not None:  # ZeRO-3: sketches of the gradient slices
            from d3ray.train.scheduling.sharded_influence import ShardedScorer

            self.scorer = ShardedScorer(trainer, requests.sketch.influence, run_dir=run_dir)
        self.fetcher = BatchFetcher(coordinator) if self.scorer is not None and self.rank == 0 else None

    def start(self, version: int, step: int, logs: Any = None) -> None:
        """Before the first chunk this process trains: what the first chunks need, at ``version`` (0 on a
        fresh run). ``logs``: rank 0's ``RunLogs`` (the snapshot's and the sketching's seconds go there:
        ``time/snapshot_sec``, ``time/in_trainer_influence_sec``), else None."""
        self.logs = logs
        self._prepare(version, step)

    @property
    def prepares_after_checkpoint(self) -> bool:
        """Whether a chunk boundary's preparation waits for the boundary's checkpoint (:func:`prepares_after_checkpoint`)."""
        return prepares_after_checkpoint(self.requests)

    def chunk_trained(self, chunk: Any, losses: np.ndarray, step: int, more: bool) -> None:
        """After the last step of ``chunk``: its feedback (rank 0, before any checkpoint: the coordinator's
        state in it waits for that feedback), then, when ``more`` chunks train and the preparation does not
        wait for the checkpoint, what the next ones need at version ``chunk.chunk_id + 1``."""
        if self.requests.feedback is not None and self.rank == 0:
            self.coordinator.feedback.remote(chunk_feedback(chunk, losses))
        if more and not self.prepares_after_checkpoint:
            self._prepare(chunk.chunk_id + 1, step)

    def after_checkpoint(self, chunk: Any, step: int, more: bool) -> None:
        """After the boundary's checkpoint (saved or not due): the preparation :meth:`chunk_trained` left to it."""
        if more and self.prepares_after_checkpoint:
            self._prepare(chunk.chunk_id + 1, step)

    def _prepare(self, version: int, step: int) -> None:
        if self.requests.snapshot is not None:
            start = time.perf_counter()
            publish_snapshot(self.trainer, self.coordinator, version, self.requests.snapshot)
            if self.logs is not None:  # what the snapshot costs the trainers, beside their steps
                self.logs.log_metrics({"step": step, "time/snapshot_sec": time.perf_counter() - start})
        if self.scorer is not None:
            sketch = self.requests.sketch
            seconds = sketch_due_chunks(self.scorer, sketch, chunks_to_train(version, step, self.steps, sketch.L),
                                        self.coordinator, version, self.rank, self.fetcher)
            if self.fetcher is not None:  # the next boundary's batches, while the next chunk trains
                self.fetcher.ahead(sketch.due(version + 1, chunks_to_train(version + 1, step + sketch.L,
                                                                           self.steps, sketch.L)))
            if self.logs is not None:  # the pass, and of it the batches' fetch and the scoring itself
                self.logs.log_metrics({"step": step, "time/in_trainer_influence_sec": seconds["total"],
                                       "time/in_trainer_fetch_sec": seconds["fetch"],
                                       "time/in_trainer_score_sec": seconds["score"]})

    def save(self, directory: Path) -> None:
        """Into a checkpoint directory: this rank's sketcher state (nothing without a sketch request)."""
        if self.scorer is not None:
            self.scorer.save(directory)

    def restore(self, directory: Path) -> None:
        """From a checkpoint directory: this rank's sketcher state, if it saved one."""
        if self.scorer is not None:
            self.scorer.load(directory)
