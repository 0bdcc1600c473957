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

    The potential alone (``drift``, ``residual: none``, the AdamW step: ``D3ScheduleConfig.sorts_potential``)
    needs no solver: S[i, j] = η·(f_j − f_i) is ordered exactly by the sort of f (the LOP's optimum,
    ``d3ray/solver/potential.py``). The L numbers f are sorted where they are, no S built: in the
    coordinator when the trainers send them (the default, ``in_trainer``: ``submit`` decides at once), in
    the influence actor when one actor computes them (``ChunkInfluenceWorker.order_chunk``); no merge
    task, no solver actor. Its log row says ``decided_by: sorted by potential, no search``
    (docs/design/d3-default-order.md). Every decision's row carries the order's predicted loss change
    against stream order and the mean random order (``d3ray/solver/loss_change.py``).

Everything is keyed by global batch id ``chunk_id * L + position``: a retried task on a restarted
actor recomputes the same thing (docs/design/ray.md §4). ``A`` and ``S`` follow docs/design/method.md §5:
``A = −γ·G Gᵀ + (γ²/2)·Q Hᵀ``, ``S = Aᵀ − A``; the order minimises the backward positive weight of S.
"""

from __future__ import annotations

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
from d3ray.solver.loss_change import forward_weight, potential_forward_weight, predicted_loss_change
from d3ray.solver.potential import sort_by_potential

if TYPE_CHECKING:  # configs imports this module in D3ScheduleConfig.build: a type only, no import circle
    from d3ray.schedule.order.configs import D3ScheduleConfig

logger = logging.getLogger(__name__)


class ChunkInfluenceWorker(InfluenceWorker):
    """An InfluenceWorker that reads the chunk's ``GlobalBatch`` objects by reference."""

    def __init__(self, model_config: dict[str, Any], config: InfluenceConfig, run_dir: str | None,
                 index: int, nice: int = 0, lora: LoraConfig | None = None, attn_implementation: str = "eager",
                 idle: bool = False, sorts: bool = False) -> None:
        if run_dir is not None:
            route_logs_to_run_dir(run_dir, f"influence-{index}")
        super().__init__(model_config, config, lora, attn_implementation)
        self.run_dir, self.index = run_dir, index
        self._sorts = sorts  # order_chunk sorts the potential here (D3ScheduleConfig.sorts_in_influence_actor)
        self._warm_up()
        # Background priority from here on (influence_nice / influence_idle): the model is built at Ray's
        # priority, during the trainers' start-up (they wait for it: ScheduleCoordinator.scheduler_ready).
        lower_priority(nice, idle)

    def _warm_up(self) -> None:
        """One-time costs paid here, in the constructor (which the trainers wait for before their clock
        starts), not in the first chunk's decision: the model's first forward."""
        with torch.no_grad():
            self.model(torch.zeros((1, 2), dtype=torch.int64, device=self.device))

    def order_chunk(self, chunk_id: int, weights: list, batch_refs: list,
                    batch_ids: list[int]) -> tuple[dict[str, Any], Any]:
        """The chunk's potential f in this actor (``D3ScheduleConfig.sorts_in_influence_actor``): (info for
        the log, :class:`~d3ray.influence.influence.ChunkPotential`); the coordinator sorts it (no S)."""
        from d3ray.influence.influence import chunk_potential

        if not self._sorts:
            raise RuntimeError("order_chunk: this influence actor was built to sketch, not to sort the potential")
        part = self.sketch_chunk(chunk_id, weights, batch_refs, batch_ids, None, False)
        faults.inject(self.run_dir, "solve", key=chunk_id)  # the drill of the actor that orders (no solver here)
        info = {"influence_sec": float(part.timings.get("influence/total_sec", 0.0)),
                "influence_bytes": int(_part_bytes(part))}
        return info, chunk_potential(part)

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
    """(S or f, info) from the trainers' ChunkInfluence (S) or ChunkPotential (f; ``influence_placement:
    in_trainer``), checked against the chunk's batch ids (a mismatch gives None and ``info["error"]``: the
    chunk falls back)."""
    values = getattr(influence, "S", None)
    if values is None:
        values = influence.potential
    info: dict[str, Any] = {"influence_sec": float(influence.timings.get("influence/total_sec", 0.0)),
                            "influence_bytes": int(values.nbytes + influence.losses.nbytes)}
    if list(influence.batch_ids) != list(batch_ids):
        return None, {**info, "error": f"trainer influence is for batches {influence.batch_ids}, not {batch_ids}"}
    info["excluded_batches"] = [int(b) for b in influence.excluded]
    return values, info


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


def assemble_potential(batch_ids: list[int], *parts: Any) -> tuple[dict[str, Any], Any]:
    """Join several actors' shares of a chunk's potential f into one ChunkPotential (no S): (info, potential).
    A part that fails to join gives ``info["error"]`` and None (the chunk falls back)."""
    from d3ray.influence.influence import ChunkPotential

    info: dict[str, Any] = {"influence_sec": max(p.timings.get("influence/total_sec", 0.0) for p in parts),
                            "influence_bytes": int(sum(_part_bytes(p) for p in parts))}
    where = {int(b): (p, r) for p in parts for r, b in enumerate(p.batch_ids)}
    if sorted(where) != sorted(int(b) for b in batch_ids) or any(p.potential is None for p in parts):
        return {**info, "error": f"influence parts cover batches {sorted(where)}, not {list(batch_ids)}"}, None
    f = np.array([where[int(b)][0].potential[where[int(b)][1]] for b in batch_ids], dtype=np.float64)
    losses = np.array([where[int(b)][0].losses[where[int(b)][1]] for b in batch_ids], dtype=np.float64)
    excluded = [int(b) for p in parts for b in p.excluded]
    return info, ChunkPotential(batch_ids=list(batch_ids), potential=f, excluded=excluded, losses=losses,
                                step_size=float(parts[0].step_size))


#: The schedule log's ``decided_by`` of a chunk ordered by the sort of its potential.
SORTED_BY_POTENTIAL = "sorted by potential, no search"


def unsearchable(S: Any, n: int) -> str | None:
    """Why a solver cannot search ``S`` for a chunk of ``n`` batches (None: it can): not an (n, n) matrix,
    a NaN or inf entry, or not antisymmetric (the solvers' own check, ``validate_advantage``)."""
    from d3ray.solver.problem import validate_advantage

    shape = getattr(S, "shape", None)
    if shape != (n, n):
        return f"S of shape {shape}, not ({n}, {n})"
    try:
        validate_advantage(S)
    except ValueError as err:
        return str(err)
    return None


def potential_decision(cfg: D3ScheduleConfig, chunk_id: int, batch_ids: list[int], potential: Any,
                       info: dict[str, Any], started: float) -> ChunkDecision:
    """The decision of a chunk whose S is the potential alone: the sort of f (``sort_by_potential``), with
    its predicted loss change against stream order and the mean random order (``loss_change``), from f.

    A potential of the wrong length is refused: the chunk falls back to stream order, with the reason."""
    base = _base_record(cfg)
    n = len(batch_ids)
    f = np.asarray(potential.potential, dtype=np.float64)
    if f.shape != (n,) or list(potential.batch_ids) != list(batch_ids):
        return _fallback(n, None, f"chunk {chunk_id}: a potential of shape {f.shape} for batches "
                                  f"{list(potential.batch_ids)}, not ({n},) for {list(batch_ids)}; stream order", base)
    t0 = time.perf_counter()
    excluded = set(int(b) for b in potential.excluded)
    order, left_out = sort_by_potential(f, np.array([int(b) in excluded for b in batch_ids], dtype=bool))
    eta = float(potential.step_size)
    chosen = potential_forward_weight(f, order, eta, left_out)
    stream = potential_forward_weight(f, np.arange(n), eta, left_out)
    kept = f[~left_out]
    record = {**base, **info, "decided_by": SORTED_BY_POTENTIAL, "search": False,
              **predicted_loss_change(chosen, stream),
              "potential": [float(v) if ok else None for v, ok in zip(f, ~left_out, strict=True)],
              "step_size": eta, "solver_sec": time.perf_counter() - t0,
              "excluded_batches": [int(b) for b, out in zip(batch_ids, left_out, strict=True) if out],
              "zero_S": bool(kept.size == 0 or np.ptp(kept) == 0.0),
              "schedule_sec": time.perf_counter() - started}
    matrix = potential_matrix(f, left_out, eta) if cfg.save_matrices else None  # only when asked
    return ChunkDecision(order=tuple(int(i) for i in order), fallback=False, record=record, matrix=matrix)


def potential_matrix(f: np.ndarray, excluded: np.ndarray, step_size: float) -> np.ndarray:
    """S = η·(f_j − f_i) (d3ray/influence/potential.py, eq. P3), zero in the excluded rows and columns, as
    ``influence_from_sketches`` merges it: built only where an S is asked for (``save_matrices``, or the
    ``exact`` reference solver on a potential)."""
    from d3ray.influence.potential import potential_antisymmetric

    excluded = np.asarray(excluded, dtype=bool) | ~np.isfinite(f)
    S = potential_antisymmetric(np.where(excluded, 0.0, f), step_size)
    S[excluded, :] = 0.0
    S[:, excluded] = 0.0
    return S


@dataclass
class PotentialPending:
    """The in-flight potential of one chunk (influence actors); the coordinator sorts it when it arrives."""

    cfg: D3ScheduleConfig
    chunk_id: int
    batch_ids: list[int]
    info_ref: Any
    potential_ref: Any
    started: float

    def result(self, timeout_s: float | None) -> ChunkDecision:
        return result_by_deadline(self._decide, self._missed, timeout_s)

    def _missed(self, reason: str) -> ChunkDecision:
        return _fallback(len(self.batch_ids), None, reason, _base_record(self.cfg))

    def _decide(self, deadline: Deadline) -> ChunkDecision:
        info = deadline.get(self.info_ref)
        if "error" in info:
            return _fallback(len(self.batch_ids), None, info["error"], _base_record(self.cfg))
        potential = deadline.get(self.potential_ref)
        return potential_decision(self.cfg, self.chunk_id, self.batch_ids, potential, info, self.started)


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
                    ctx.model.attn_implementation, cfg.influence_idle, cfg.sorts_in_influence_actor)
            for i in range(cfg.influence_actors)
        ]
        # The potential alone: its order is the sort of f, made where f is (no S, no solver actor).
        self._sorts = cfg.sorts_potential
        self.solver_pool = None if self._sorts else cfg.solver_pool.build(cfg.solver, run_dir=ctx.run_dir)
        self._assemble = ray.remote(num_cpus=0, max_retries=2)(assemble_potential if self._sorts else assemble_influence)
        self._reference: list | None = None
        # Only a pool of several influence workers that sketch something needs a shared control-variate
        # reference (the default, drift with residual none, sketches nothing: no reference, no means shipped).
        self._sketches = _sketches_anything(cfg.influence)
        self._keeps_reference = (len(self.influence_actors) > 1 and cfg.influence.control_variate
                                 and not cfg.influence.estimator.is_exact_lookahead and self._sketches)
        for key in cfg.unused_keys() + cfg.preset_departures():
            logger.warning("schedule: %s", key if "(paper:" not in key else f"the d3_paper preset no longer holds {key}")

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
        if self.cfg.in_trainer:  # the trainers' f (or S) of the whole chunk: here already (a few hundred bytes)
            import ray

            payload = ray.get(context.influence[0])
            values, info = take_trainer_influence(ids, payload)
            if values is None:
                return Decided(_fallback(chunk, None, info["error"]))
            if self._sorts:  # the sort of f, here and now: no S, no solver (docs/design/d3-default-order.md)
                return Decided(potential_decision(self.cfg, chunk.chunk_id, ids, payload, info, started))
            if getattr(payload, "S", None) is None and np.shape(values) == (n,):  # f for the exact reference solver
                values = potential_matrix(values, np.isin(ids, payload.excluded), payload.step_size)
            problem = unsearchable(values, n)
            if problem is not None:
                return Decided(_fallback(chunk, None, f"chunk {chunk.chunk_id}: S cannot be searched ({problem}); "
                                                      f"stream order", _base_record(self.cfg)))
            S_ref, info_ref = ray.put(values), ray.put(info)
            solve_ref = self.solver_pool.submit(chunk.chunk_id, S_ref, seed=seed)
            return D3Pending(self.cfg, chunk.chunk_id, n, S_ref, info_ref, solve_ref, started)
        if self.cfg.sorts_in_influence_actor:
            info_ref, potential_ref = actors[0].order_chunk.options(num_returns=2).remote(
                chunk.chunk_id, weights, refs, ids)
            return PotentialPending(self.cfg, chunk.chunk_id, ids, info_ref, potential_ref, started)
        if self.cfg.influence.estimator.is_exact_lookahead:
            parts = [a.lookahead_chunk.remote(chunk.chunk_id, weights, refs, ids, ids[k::len(actors)])
                     for k, a in enumerate(actors) if ids[k::len(actors)]]
        else:  # several workers share a chunk only once a common reference (the last chunk's) exists
            shared = len(actors) > 1 and (self._reference is not None or not self._sketches)
            splits = np.array_split(np.arange(n), len(actors)) if shared else [np.arange(n)]
            parts = [actors[k].sketch_chunk.remote(chunk.chunk_id, weights, [refs[i] for i in part], [ids[i] for i in part],
                                                   self._reference if shared else None, self._keeps_reference)
                     for k, part in enumerate(splits) if len(part)]
        if self._sorts:  # several actors' shares of f, joined in one task, sorted by the coordinator
            info_ref, potential_ref = self._assemble.options(num_returns=2).remote(ids, *parts)
            return PotentialPending(self.cfg, chunk.chunk_id, ids, info_ref, potential_ref, started)
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
    record = {"scheduler": cfg.type_name, "estimator": cfg.influence.estimator.describe(),
              "influence_placement": cfg.placement, "solver": "sort" if cfg.sorts_potential else cfg.solver.type_name,
              "staleness": cfg.staleness}
    departures = cfg.preset_departures()
    if departures:
        record["preset_departures"] = departures
    return record


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
        problem = None if S is None else unsearchable(S, self.n)
        if problem is not None:  # no row sum of an S the solver refused: stream order
            return _fallback(self.n, None, f"chunk {self.chunk_id}: S cannot be searched ({problem}); stream order",
                             _base_record(self.cfg))
        return _fallback(self.n, S, reason, _base_record(self.cfg))

    def _decide(self, deadline: Deadline) -> ChunkDecision:

        base = _base_record(self.cfg)
        info = deadline.get(self.info_ref)
        if "error" in info:
            return _fallback(self.n, None, info["error"], base)
        S = deadline.get(self.S_ref)
        problem = unsearchable(S, self.n)
        if problem is not None:  # refused at the chunk, before the solver's answer (an error) is awaited
            return _fallback(self.n, None, f"chunk {self.chunk_id}: S cannot be searched ({problem}); stream order", base)
        result = deadline.get(self.solve_ref)
        order = tuple(int(i) for i in result.order)
        shortcut = "shortcut" in result.stats
        record = {
            **base, **info,
            "decided_by": (f"sorted by the fitted potential ({self.cfg.solver.type_name}'s short-cut), no search"
                           if shortcut else f"searched by {self.cfg.solver.type_name}"),
            "search": not shortcut,
            **predicted_loss_change(forward_weight(S, np.asarray(order)), forward_weight(S, np.arange(self.n))),
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
