"""D3's decision of a chunk, wherever its influence was computed: the sort of a potential f, a solver's
search of S, or the fallback (row-sum order of S when S exists, else stream order).

    potential_decision(f)      the sort of f (``sort_by_potential``, the LOP's optimum: no S, no search)
    PotentialPending           f in flight (influence actors); the coordinator sorts it when it arrives
    submit_solve(S ref)        S to the solver pool ─► D3Pending: the solved order, or the fallback past
                               the deadline / on failure (``result_by_deadline``)

Every decision's log row carries what decided it (:func:`base_record`: scheduler, estimator, placement,
solver, staleness) and the order's predicted loss change against stream order and the mean random order
(``d3ray/solver/loss_change.py``). ``S`` follows docs/design/method.md §5: ``A = −γ·G Gᵀ + (γ²/2)·Q Hᵀ``,
``S = Aᵀ − A``; the order minimises the backward positive weight of S.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from d3ray.ray_refs import Deadline, result_by_deadline
from d3ray.schedule.scheduler import ChunkDecision
from d3ray.solver import ordering_cost, row_sum_order
from d3ray.solver.loss_change import forward_weight, potential_forward_weight, predicted_loss_change
from d3ray.solver.potential import potential_matrix, sort_by_potential

if TYPE_CHECKING:  # config imports the placements, which import this module: a type only, no import circle
    from d3ray.schedule.order.d3.config import D3ScheduleConfig

logger = logging.getLogger(__name__)

#: The schedule log's ``decided_by`` of a chunk ordered by the sort of its potential.
SORTED_BY_POTENTIAL = "sorted by potential, no search"


def unsearchable(S: Any, L: int) -> str | None:
    """Why a solver cannot search ``S`` for a chunk of ``L`` batches (None: it can): not an (L, L) matrix,
    a NaN or inf entry, or not antisymmetric (the solvers' own check, ``validate_advantage``)."""
    from d3ray.solver.problem import validate_advantage

    shape = getattr(S, "shape", None)
    if shape != (L, L):
        return f"S of shape {shape}, not ({L}, {L})"
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
    base = base_record(cfg)
    L = len(batch_ids)
    f = np.asarray(potential.potential, dtype=np.float64)
    if f.shape != (L,) or list(potential.batch_ids) != list(batch_ids):
        return fallback(L, None, f"chunk {chunk_id}: a potential of shape {f.shape} for batches "
                                  f"{list(potential.batch_ids)}, not ({L},) for {list(batch_ids)}; stream order", base)
    t0 = time.perf_counter()
    excluded = set(int(b) for b in potential.excluded)
    eta = float(potential.step_size)
    order, left_out = sort_by_potential(f, np.array([int(b) in excluded for b in batch_ids], dtype=bool), eta)
    chosen = potential_forward_weight(f, order, eta, left_out)
    stream = potential_forward_weight(f, np.arange(L), eta, left_out)
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
        return fallback(len(self.batch_ids), None, reason, base_record(self.cfg))

    def _decide(self, deadline: Deadline) -> ChunkDecision:
        info = deadline.get(self.info_ref)
        if "error" in info:
            return fallback(len(self.batch_ids), None, info["error"], base_record(self.cfg))
        potential = deadline.get(self.potential_ref)
        return potential_decision(self.cfg, self.chunk_id, self.batch_ids, potential, info, self.started)


def base_record(cfg: D3ScheduleConfig) -> dict[str, Any]:
    """The schedule-log fields of every D3 decision: what decided it."""
    record = {"scheduler": cfg.type_name, "estimator": cfg.influence.estimator.describe(),
              "influence_placement": cfg.placement.type_name, "solver": "sort" if cfg.sorts_potential else cfg.solver.type_name,
              "staleness": cfg.staleness}
    departures = cfg.preset_departures()
    if departures:
        record["preset_departures"] = departures
    return record


def fallback(chunk_or_L: Any, S: np.ndarray | None, reason: str, record: dict | None = None) -> ChunkDecision:
    """The fallback decision of a chunk (a ``Chunk`` or its L, the batches in it): the row-sum order of ``S`` when there is
    one (the solver's initial order), else stream order; ``reason`` goes to the log and its row."""
    L = chunk_or_L if isinstance(chunk_or_L, int) else chunk_or_L.size
    if S is not None:
        order = tuple(int(i) for i in row_sum_order(S))
        kind = "row_sum"
    else:
        order = tuple(range(L))
        kind = "stream"
    logger.warning("D3 fallback (%s order): %s", kind, reason)
    rec = {"scheduler": "d3", "fallback_reason": reason, "fallback_order": kind, **(record or {})}
    if S is not None:
        rec.update(cost_stream=ordering_cost(S, np.arange(L)), cost_after=ordering_cost(S, np.asarray(order)))
    return ChunkDecision(order=order, fallback=True, record=rec, matrix=S)


@dataclass
class D3Pending:
    """The in-flight influence + solve of one chunk."""

    cfg: D3ScheduleConfig
    chunk_id: int
    L: int
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
        problem = None if S is None else unsearchable(S, self.L)
        if problem is not None:  # no row sum of an S the solver refused: stream order
            return fallback(self.L, None, f"chunk {self.chunk_id}: S cannot be searched ({problem}); stream order",
                             base_record(self.cfg))
        return fallback(self.L, S, reason, base_record(self.cfg))

    def _decide(self, deadline: Deadline) -> ChunkDecision:

        base = base_record(self.cfg)
        info = deadline.get(self.info_ref)
        if "error" in info:
            return fallback(self.L, None, info["error"], base)
        S = deadline.get(self.S_ref)
        problem = unsearchable(S, self.L)
        if problem is not None:  # refused at the chunk, before the solver's answer (an error) is awaited
            return fallback(self.L, None, f"chunk {self.chunk_id}: S cannot be searched ({problem}); stream order", base)
        result = deadline.get(self.solve_ref)
        order = tuple(int(i) for i in result.order)
        shortcut = "shortcut" in result.stats
        record = {
            **base, **info,
            "decided_by": (f"sorted by the fitted potential ({self.cfg.solver.type_name}'s short-cut), no search"
                           if shortcut else f"searched by {self.cfg.solver.type_name}"),
            "search": not shortcut,
            **predicted_loss_change(forward_weight(S, np.asarray(order)), forward_weight(S, np.arange(self.L))),
            "cost_stream": ordering_cost(S, np.arange(self.L)),
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




def chunk_refs(chunk: Any, batch_refs: Any) -> list:
    """The chunk's batch refs as a list, one per batch (ValueError otherwise)."""
    refs = list(batch_refs)
    if len(refs) != chunk.size:
        raise ValueError(f"chunk {chunk.chunk_id}: expected {chunk.size} batch refs, got {len(refs)}")
    return refs


def chunk_seed(seed: int, chunk_id: int) -> int:
    """The solver's seed for one chunk of a run seeded ``seed`` (the same chunk, the same search)."""
    return seed * 1_000_003 + chunk_id


def submit_solve(cfg: D3ScheduleConfig, chunk_id: int, L: int, S_ref: Any, info_ref: Any, solver_pool: Any,
                 seed: int, started: float) -> D3Pending:
    """Hand a chunk's S (a Ray ref: the solver starts as soon as S exists) to the solver pool; its pending decision."""
    solve_ref = solver_pool.submit(chunk_id, S_ref, seed=chunk_seed(seed, chunk_id))
    return D3Pending(cfg, chunk_id, L, S_ref, info_ref, solve_ref, started)
