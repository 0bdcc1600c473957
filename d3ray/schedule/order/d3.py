"""The D3 scheduler: influence actors sketch chunk c+1 while the trainers train chunk c, a solver
pool orders it, and the trainers get the order (or a fallback past the deadline).

    submit(chunk, weights) — called by the coordinator when it produces a chunk; returns at once
      │ batches of the chunk split across the InfluenceWorker pool (refs, not bytes):
      │   ChunkInfluenceWorker.sketch_chunk(weights, batch refs, batch ids)  ─► BatchSketches
      │ assemble_influence(*parts)   (Ray resolves the parts)  ─► S (L, L), info, next reference
      │ SolverPool.submit(S ref)     (starts as soon as S exists) ─► SolveResult
      ▼
    D3Pending.result(deadline) — called when the trainers need the chunk:
      the solved order; or, past the deadline / on failure, the fallback: row_sum(S) when S
      exists (the solver's initial order), else the stream order. Recorded as ``fallback``.

    With ``first_chunk: stream`` (the no-argument run) chunk 0 is decided in stream order at submit,
    without influence (``first_chunk: stream_order`` in its log row), so the first step never waits.

    The default (one influence actor, S the exact drift potential alone: ``sorts_in_influence_actor``)
    takes one hop instead of three: ``ChunkInfluenceWorker.order_chunk`` computes f, S and the sort
    by f (the LOP's certified optimum, ``d3ray/solver/potential.py``) in the actor; no merge task and
    no solver actor exist. Measured with ``d3ray bench pipeline`` (README.md, "Benchmarks").

Everything is keyed by global batch id ``chunk_id * L + position``: a retried task on a restarted
actor recomputes the same thing (RAY_NOTES section 4). ``A`` and ``S`` follow ARCHITECTURE.md §1:
``A = −γ·G Gᵀ + (γ²/2)·Q Hᵀ``, ``S = Aᵀ − A``; the order minimises the backward positive weight of S.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from d3ray import faults
from d3ray.data.chunker import Chunk
from d3ray.data.labels import lm_labels
from d3ray.influence.config import InfluenceConfig
from d3ray.influence.estimators import EstimatorConfig
from d3ray.influence.resources import lower_priority
from d3ray.influence.worker import InfluenceWorker
from d3ray.lora import LoraConfig
from d3ray.ray_refs import Deadline, result_by_deadline
from d3ray.run_files import route_logs_to_run_dir
from d3ray.schedule.scheduler import (
    BuildContext,
    ChunkDecision,
    Decided,
    PendingDecision,
    SchedulerBase,
    SubmitContext,
)
from d3ray.solver import ordering_cost, row_sum_order
from d3ray.solver.base import SolverConfig, SolveResult

if TYPE_CHECKING:  # configs imports this module in D3ScheduleConfig.build: a type only, no import circle
    from d3ray.schedule.order.configs import D3ScheduleConfig

logger = logging.getLogger(__name__)


class ChunkInfluenceWorker(InfluenceWorker):
    """An InfluenceWorker that reads the chunk's ``GlobalBatch`` objects by reference."""

    def __init__(self, model_config: dict[str, Any], config: InfluenceConfig, run_dir: str | None,
                 index: int, nice: int = 0, lora: LoraConfig | None = None, attn_implementation: str = "eager",
                 idle: bool = False, solver: SolverConfig | None = None) -> None:
        if run_dir is not None:
            route_logs_to_run_dir(run_dir, f"influence-{index}")
        super().__init__(model_config, config, lora, attn_implementation)
        self.run_dir, self.index = run_dir, index
        self._solver = None if solver is None else solver.build()  # order_chunk's (sorts_in_influence_actor)
        self._warm_up()
        # Background priority from here on (influence_nice / influence_idle): the model is built at Ray's
        # priority, during the trainers' start-up (they wait for it: ScheduleCoordinator.scheduler_ready).
        lower_priority(nice, idle)

    def _warm_up(self) -> None:
        """One-time costs paid here, in the constructor (which the trainers wait for before their clock
        starts), not in the first chunk's decision: the model's first forward and, for
        :meth:`order_chunk`, the solver's lazy imports (0.4 s on a 2-core box)."""
        with torch.no_grad():
            self.model(torch.zeros((1, 2), dtype=torch.int64, device=self.device))
        if self._solver is not None:
            potential = np.arange(4.0)
            self._solver.solve(potential[None, :] - potential[:, None])

    def order_chunk(self, chunk_id: int, weights: list, batch_refs: list, batch_ids: list[int],
                    seed: int) -> tuple[np.ndarray | None, dict[str, Any], SolveResult | None]:
        """The whole decision of a chunk in this actor (``D3ScheduleConfig.sorts_in_influence_actor``; the
        actor was built with the run's solver): the potentials, S (as :func:`assemble_influence` merges
        it) and its order, which for this S is the certified sort by f (no search). Returns
        ``(S, info, result)``: S None, ``info["error"]`` and no result when the merge failed (the chunk
        falls back)."""
        if self._solver is None:
            raise RuntimeError("order_chunk: this influence actor was built without a solver")
        part = self.sketch_chunk(chunk_id, weights, batch_refs, batch_ids, None, False)
        S, info, _ = assemble_influence(self.config.estimator, list(batch_ids), part)
        if S is None:
            return None, info, None
        faults.inject(self.run_dir, "solve", key=chunk_id)
        result = self._solver.solve(S, seed=seed)
        return S, info, dataclasses.replace(result, stats={**result.stats, "key": chunk_id})

    def _as_inputs(self, batch_refs: list, batch_ids: list[int]) -> list[dict[str, np.ndarray]]:
        import ray

        out = []
        for batch, bid in zip(ray.get(list(batch_refs)), batch_ids, strict=True):
            ids = np.asarray(batch.input_ids, dtype=np.int64)
            labels = lm_labels(ids, batch.n_tokens, batch.loss_mask)
            faults.inject(self.run_dir, "influence_batch", batch_id=bid, labels=labels)
            out.append({"input_ids": ids, "labels": labels})
        return out

    def sketch_chunk(self, chunk_id: int, weights: list, batch_refs: list, batch_ids: list[int],
                     reference: list | None, return_means: bool):
        """Sketches of this worker's share of the chunk; ``reference`` = [ref of the previous chunk's
        mean directions] when several workers share a chunk (None: this call's own mean);
        ``return_means``: also return this share's full-dimension means (the next chunk's reference,
        3·d floats: only worth shipping when several workers share chunks)."""
        import ray
        from ray.exceptions import RayError

        faults.inject(self.run_dir, "influence_chunk", actor=self.index, chunk_id=chunk_id)
        ref_value = None
        if reference is not None:
            try:
                ref_value = ray.get(reference[0])
            except RayError as err:  # the previous chunk failed; its parts will not merge: fallback there
                logger.warning("chunk %d: no control-variate reference (%s)", chunk_id, type(err).__name__)
        return self.sketch_batches(weights, self._as_inputs(batch_refs, batch_ids), batch_ids,
                                   reference=ref_value, return_means=return_means)

    def lookahead_chunk(self, chunk_id: int, weights: list, batch_refs: list, batch_ids: list[int],
                        rows: list[int]):
        faults.inject(self.run_dir, "influence_chunk", actor=self.index, chunk_id=chunk_id)
        return self.lookahead_matrix(weights, self._as_inputs(batch_refs, batch_ids), batch_ids, rows=rows)


def take_trainer_influence(batch_ids: list[int], influence: Any) -> tuple[np.ndarray | None, dict[str, Any]]:
    """(S, info) from the trainers' ChunkInfluence (``influence_placement: in_trainer``), checked
    against the chunk's batch ids (a mismatch gives S None and ``info["error"]``: the chunk falls back)."""
    info: dict[str, Any] = {"influence_sec": float(influence.timings.get("influence/total_sec", 0.0)),
                            "influence_bytes": int(influence.S.nbytes + influence.losses.nbytes)}
    if list(influence.batch_ids) != list(batch_ids):
        return None, {**info, "error": f"trainer influence is for batches {influence.batch_ids}, not {batch_ids}"}
    info["excluded_batches"] = [int(b) for b in influence.excluded]
    return influence.S, info


def _part_bytes(part: Any) -> int:
    """Bytes of a worker's part as shipped to the merge: sketch rows (or look-ahead rows) and losses."""
    arrays = [getattr(part, name, None) for name in ("G", "Q", "H", "U", "A_rows", "losses")]
    return sum(a.nbytes for a in arrays if isinstance(a, np.ndarray))


def assemble_influence(estimator: EstimatorConfig, batch_ids: list[int], *parts: Any):
    """Merge the workers' parts into S (L, L); also the info for the log and the next reference.

    Returns ``(S or None, info, reference)``: a merge that fails gives ``S = None`` and
    ``info["error"]`` (the chunk falls back) but still the next chunk's control-variate reference,
    so one bad chunk does not poison the next.
    """
    from d3ray.influence.control_variate import mean_reference

    means = [p.means for p in parts if getattr(p, "means", None) is not None]
    reference = mean_reference(means) if means else None
    info: dict[str, Any] = {"influence_sec": max(p.timings.get("influence/total_sec", 0.0) for p in parts),
                            "influence_bytes": int(sum(_part_bytes(p) for p in parts))}
    try:
        _, S, excluded = estimator.merge(parts, batch_ids)
    except ValueError as err:
        return None, {**info, "error": f"influence merge failed: {err}"}, reference
    info["excluded_batches"] = [int(b) for b in excluded]
    return S, info, reference


class D3Scheduler(SchedulerBase):
    """Owns the influence actors and the solver pool of a run (created in the driver, used by the coordinator)."""

    def __init__(self, cfg: D3ScheduleConfig, ctx: BuildContext) -> None:
        import ray

        self.cfg = cfg
        self.seed = ctx.seed
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        # Own resources, never a Tune trial's placement group (which holds only its driver).
        opts: dict[str, Any] = dict(num_cpus=cfg.influence_num_cpus, max_restarts=cfg.influence_max_restarts,
                                    max_task_retries=cfg.influence_max_restarts,
                                    scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=None))
        if cfg.influence_num_gpus:
            opts["num_gpus"] = cfg.influence_num_gpus
        if cfg.influence_resources:
            opts["resources"] = dict(cfg.influence_resources)
        remote = ray.remote(ChunkInfluenceWorker)
        self.influence_actors = [] if cfg.in_trainer else [  # in_trainer: the trainers sketch (context.influence)
            remote.options(name=f"d3ray:{ctx.run_name}:influence:{i}", get_if_exists=False, **opts)
            .remote(ctx.model_config, cfg.influence, ctx.run_dir, i, cfg.influence_nice, ctx.model.lora,
                    ctx.model.attn_implementation, cfg.influence_idle,
                    cfg.solver if cfg.sorts_in_influence_actor else None)
            for i in range(cfg.influence_actors)
        ]
        # The exact potential alone in one actor: it orders the chunk itself (no solver actor, no merge task).
        self._in_actor = cfg.sorts_in_influence_actor
        # The trainers' S of the potential alone: sorted here (the certified sort), no solver actor either.
        self._solver = cfg.solver.build() if cfg.sorts_in_coordinator else None
        self.solver_pool = (None if self._in_actor or self._solver is not None
                            else cfg.solver_pool.build(cfg.solver, run_dir=ctx.run_dir))
        self._assemble = ray.remote(num_cpus=0, max_retries=2)(assemble_influence)
        self._reference: list | None = None
        # Only a pool of several influence workers that sketch something needs a shared control-variate
        # reference (the default, drift with residual none, sketches nothing: no reference, no means shipped).
        self._sketches = _sketches_anything(cfg.influence)
        self._keeps_reference = (len(self.influence_actors) > 1 and cfg.influence.control_variate
                                 and not cfg.influence.estimator.is_exact_lookahead and self._sketches)

    def submit(self, chunk: Chunk, batch_refs: tuple, context: SubmitContext) -> PendingDecision:
        n = chunk.size
        if chunk.chunk_id == 0 and self.cfg.first_chunk == "stream":
            # Decided at once, without influence: the trainers' first step does not wait (D3ScheduleConfig.first_chunk).
            return Decided(ChunkDecision(order=tuple(range(n)), fallback=False,
                                         record={**_base_record(self.cfg), "first_chunk": "stream_order"}))
        if self.cfg.in_trainer and context.influence is None:
            return Decided(_fallback(chunk, None, "no influence from the trainers in time"))
        if not self.cfg.in_trainer and context.weights is None:
            return Decided(_fallback(chunk, None, "no weights snapshot published in time"))
        refs = list(batch_refs)
        if len(refs) != n:
            raise ValueError(f"chunk {chunk.chunk_id}: expected {n} batch refs, got {len(refs)}")
        ids = list(chunk.batch_ids)
        actors = self.influence_actors
        weights = context.weights
        started = time.perf_counter()
        seed = self.seed * 1_000_003 + chunk.chunk_id
        if self.cfg.in_trainer:  # the trainers' S of the whole chunk: here already (a few hundred bytes)
            import ray

            S, info = take_trainer_influence(ids, ray.get(context.influence[0]))
            if S is None:
                return Decided(_fallback(chunk, None, info["error"]))
            S_ref, info_ref = ray.put(S), ray.put(info)
            if self._solver is not None:  # rank 2: the sort by f, certified optimal (no search)
                solve_ref = ray.put(self._solver.solve(S, seed=seed))
            else:
                solve_ref = self.solver_pool.submit(chunk.chunk_id, S_ref, seed=seed)
            return D3Pending(self.cfg, chunk.chunk_id, n, S_ref, info_ref, solve_ref, started)
        if self._in_actor:
            S_ref, info_ref, solve_ref = actors[0].order_chunk.options(num_returns=3).remote(
                chunk.chunk_id, weights, refs, ids, seed)
            return D3Pending(self.cfg, chunk.chunk_id, n, S_ref, info_ref, solve_ref, started)
        if self.cfg.influence.estimator.is_exact_lookahead:
            parts = [a.lookahead_chunk.remote(chunk.chunk_id, weights, refs, ids, ids[k::len(actors)])
                     for k, a in enumerate(actors) if ids[k::len(actors)]]
        else:  # several workers share a chunk only once a common reference (the last chunk's) exists
            shared = len(actors) > 1 and (self._reference is not None or not self._sketches)
            splits = np.array_split(np.arange(n), len(actors)) if shared else [np.arange(n)]
            parts = [actors[k].sketch_chunk.remote(chunk.chunk_id, weights, [refs[i] for i in part], [ids[i] for i in part],
                                                   self._reference if shared else None, self._keeps_reference)
                     for k, part in enumerate(splits) if len(part)]
        S_ref, info_ref, next_reference = self._assemble.options(num_returns=3).remote(
            self.cfg.influence.estimator, ids, *parts)
        if self._keeps_reference:
            self._reference = [next_reference]  # the next chunk's reference: this chunk's mean directions
        solve_ref = self.solver_pool.submit(chunk.chunk_id, S_ref, seed=seed)
        return D3Pending(self.cfg, chunk.chunk_id, n, S_ref, info_ref, solve_ref, started)

    def actors(self) -> dict[str, list[Any]]:
        solvers = {} if self.solver_pool is None else {"solver": list(self.solver_pool.actors)}
        return {"influence": list(self.influence_actors), **solvers}

    def close(self) -> None:
        import ray

        if self.solver_pool is not None:
            self.solver_pool.shutdown()
        for actor in self.influence_actors:
            ray.kill(actor)


def _sketches_anything(config: InfluenceConfig) -> bool:
    """Whether the influence sketches rows (as ``sketch_chunk`` decides): not for the exact drift
    potential alone (``drift`` with ``residual: none`` and the AdamW step), whose rows are zero-width."""
    potential = config.estimator.exact_potential and config.needs_optimizer_state
    return config.estimator.sketches_residual or not potential


def _base_record(cfg: D3ScheduleConfig) -> dict[str, Any]:
    """The schedule-log fields of every D3 decision: what decided it."""
    return {"scheduler": "d3", "estimator": cfg.influence.estimator.describe(),
            "influence_placement": cfg.placement, "solver": cfg.solver.type_name,
            "staleness": cfg.staleness}


def _fallback(chunk_or_n: Any, S: np.ndarray | None, reason: str, record: dict | None = None) -> ChunkDecision:
    n = chunk_or_n if isinstance(chunk_or_n, int) else chunk_or_n.size
    if S is not None:
        order = tuple(int(i) for i in row_sum_order(S))
        kind = "row_sum"
    else:
        order = tuple(range(n))
        kind = "stream"
    logger.warning("D3 fallback (%s order): %s", kind, reason)
    rec = {"scheduler": "d3", "fallback_reason": reason, "fallback_order": kind, **(record or {})}
    if S is not None:
        rec.update(cost_stream=ordering_cost(S, np.arange(n)), cost_after=ordering_cost(S, np.asarray(order)))
    return ChunkDecision(order=order, fallback=True, record=rec, matrix=S)


@dataclass
class D3Pending:
    """The in-flight influence + solve of one chunk."""

    cfg: D3ScheduleConfig
    chunk_id: int
    n: int
    S_ref: Any
    info_ref: Any
    solve_ref: Any
    started: float

    def result(self, timeout_s: float | None) -> ChunkDecision:
        return result_by_deadline(self._decide, self._missed, timeout_s)

    def _missed(self, reason: str) -> ChunkDecision:
        """Past the deadline or on a failure: the row-sum order of S when S arrived, else stream order."""
        import ray
        from ray.exceptions import RayError

        S = None
        ready, _ = ray.wait([self.S_ref], timeout=0)
        if ready:
            try:
                S = ray.get(self.S_ref)
            except RayError:
                S = None
        return _fallback(self.n, S, reason, _base_record(self.cfg))

    def _decide(self, deadline: Deadline) -> ChunkDecision:
        import ray

        base = _base_record(self.cfg)
        info = deadline.get(self.info_ref)
        if "error" in info:
            return _fallback(self.n, None, info["error"], base)
        result = deadline.get(self.solve_ref)
        S = ray.get(self.S_ref)
        order = tuple(int(i) for i in result.order)
        record = {
            **base, **info,
            "cost_stream": ordering_cost(S, np.arange(self.n)),
            "cost_before": float(result.initial_cost),
            "cost_after": float(result.cost),
            "solver_sec": float(result.seconds),
            "zero_S": bool(result.flagged_zero),
            "schedule_sec": time.perf_counter() - self.started,
        }
        if "shortcut" in result.stats:  # ordered by the sort of S's potential, without a search
            record["solver_shortcut"] = result.stats["shortcut"]
            record["solver_shortcut_exact"] = bool(result.stats["exact"])
        return ChunkDecision(order=order, fallback=False, record=record,
                             matrix=S if self.cfg.save_matrices else None)


__all__ = ["D3Scheduler", "ChunkInfluenceWorker", "assemble_influence"]
