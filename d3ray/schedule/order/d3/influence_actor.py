"""The influence actor of D3's ``actors`` placement: an InfluenceWorker that reads a chunk's batches by
reference and sketches (or, for the potential alone, scores and orders) its share of the chunk; and the
Ray tasks that join several actors' shares into S or into one potential f.

    ChunkInfluenceWorker.sketch_chunk(weights, batch refs, batch ids)  ─► BatchSketches
    assemble_influence(*parts)   (Ray resolves the parts)  ─► S (L, L), info, next reference
    assemble_potential(*parts)   several actors' shares of f ─► one ChunkPotential (sorted by the coordinator)
    ChunkInfluenceWorker.order_chunk(...)   one actor, the potential alone: f here, no merge task, no solver

Everything is keyed by global batch id ``chunk_id * L + position``: a retried task on a restarted
actor recomputes the same thing (docs/design/ray.md §4).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from d3ray import faults
from d3ray.data.labels import lm_labels
from d3ray.influence.config import InfluenceConfig
from d3ray.influence.estimators import EstimatorConfig
from d3ray.influence.resources import lower_priority
from d3ray.influence.worker import InfluenceWorker
from d3ray.model.lora import LoraConfig
from d3ray.run_files import route_logs_to_run_dir

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
        self._sorts = sorts  # order_chunk sorts the potential here (the actors placement with one actor and the potential alone)
        self._warm_up()
        # Background priority from here on (schedule.placement.nice / idle): the model is built at Ray's
        # priority, during the trainers' start-up (they wait for it: ScheduleCoordinator.scheduler_ready).
        lower_priority(nice, idle)

    def _warm_up(self) -> None:
        """One-time costs paid here, in the constructor (which the trainers wait for before their clock
        starts), not in the first chunk's decision: the model's first forward; for the Taylor estimators
        one batch's statistics (the first backward, and the double backward of ``hutchinson``) on 4 tokens,
        and P's cached blocks (the SJLT's sparse matrices), one parameter at a time."""
        with torch.no_grad():
            self.model(torch.zeros((1, 2), dtype=torch.int64, device=self.device))
        if self.config.estimator.is_exact_lookahead or self.config.potential_alone:
            return  # no statistics of a batch, nothing sketched
        tokens = np.zeros((1, 4), dtype=np.int64)
        self.config.estimator.statistics(self.objective({"input_ids": tokens}, 0), self.leaves(), self.generator(0))
        for name, param in self.leaves().items():
            self.sketch.project({name: torch.zeros((1, *param.shape), dtype=param.dtype, device=param.device)})

    def order_chunk(self, chunk_id: int, weights: list, batch_refs: list,
                    batch_ids: list[int]) -> tuple[dict[str, Any], Any]:
        """The chunk's potential f in this actor (one actor of the ``actors`` placement and the potential alone): (info for
        the log, :class:`~d3ray.influence.influence.ChunkPotential`); the coordinator sorts it (no S)."""
        from d3ray.influence.influence import chunk_potential

        if not self._sorts:
            raise RuntimeError("order_chunk: this influence actor was built to sketch, not to sort the potential")
        part = self.sketch_chunk(chunk_id, weights, batch_refs, batch_ids, None, False)
        faults.inject(self.run_dir, "solve", key=chunk_id)  # the drill of the actor that orders (no solver here)
        info = {"influence_sec": float(part.timings.get("influence/total_sec", 0.0)),
                "influence_bytes": int(part_bytes(part))}
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


def part_bytes(part: Any) -> int:
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
                            "influence_bytes": int(sum(part_bytes(p) for p in parts))}
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
                            "influence_bytes": int(sum(part_bytes(p) for p in parts))}
    where = {int(b): (p, r) for p in parts for r, b in enumerate(p.batch_ids)}
    if sorted(where) != sorted(int(b) for b in batch_ids) or any(p.potential is None for p in parts):
        return {**info, "error": f"influence parts cover batches {sorted(where)}, not {list(batch_ids)}"}, None
    f = np.array([where[int(b)][0].potential[where[int(b)][1]] for b in batch_ids], dtype=np.float64)
    losses = np.array([where[int(b)][0].losses[where[int(b)][1]] for b in batch_ids], dtype=np.float64)
    excluded = [int(b) for p in parts for b in p.excluded]
    return info, ChunkPotential(batch_ids=list(batch_ids), potential=f, excluded=excluded, losses=losses,
                                step_size=float(parts[0].step_size))


def sketches_anything(config: InfluenceConfig) -> bool:
    """Whether the influence sketches rows (as ``sketch_chunk`` decides): not for the exact drift
    potential alone (``drift`` with ``residual: none`` and the AdamW step), whose rows are zero-width."""
    potential = config.estimator.exact_potential and config.needs_optimizer_state
    return config.estimator.sketches_residual or not potential


__all__ = ["ChunkInfluenceWorker", "assemble_influence", "assemble_potential", "sketches_anything"]
