"""Pure per-chunk algorithms: sketch rows of a worker's share of a chunk, or exact look-ahead rows.

:class:`~d3ray.influence.worker.InfluenceWorker` only holds a model and calls these; tests and the
benchmark call them without an actor. Per batch (README.md for the algebra):

    statistics (estimator) ─► loss, g, h
        │ step_direction (preconditioner): Δθ = −η·u   (u is g for the plain step)
        ▼
    vectors g, q = u ⊙ u, h (and u when u ≠ g) ─► P · (one projection) ─► control variate ─► rows

``drift`` (potential.py): per batch also f_i = ⟨g_i, w⟩ in full dimension (w built once per call from the
snapshot's AdamW state), and the sketch carries u_i − w in place of u_i, or nothing (``residual: none``).
With nothing sketched, :func:`potential_chunk` gets every f_i of the call from batched passes instead
(``potential: jvp | step``): no per-batch gradient.

Control variate, two passes: with a ``reference`` shared by the workers of the chunk (the previous
chunk's mean directions) each batch is sketched as soon as its statistics exist (one batch of
full-dimension vectors in memory). Without one, the mean of this call's finite batches is the
reference, so all statistics are kept until the call's mean is known (right when one call covers
the chunk; parts with different references do not merge).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np
import torch

from d3ray.influence.config import InfluenceConfig
from d3ray.influence.control_variate import EXTRA_COLUMNS, ControlVariate
from d3ray.influence.drift import batch_potential, batched_potentials, drift_direction, drift_residual
from d3ray.influence.estimators.lookahead import lookahead_influence
from d3ray.influence.influence import BatchSketches, LookaheadRows, Reference
from d3ray.influence.optimizer import AdamWState, step_direction
from d3ray.influence.shards import Shards, reduce_sum
from d3ray.influence.sketch import Sketch, stable_seed
from d3ray.influence.statistics import BatchStatistics, CrossEntropyObjective, Params

logger = logging.getLogger(__name__)

__all__ = [
    "batch_vectors", "check_optimizer_state", "lookahead_rows", "potential_chunk", "sketch_chunk", "sketch_rows",
]

Vectors = dict[str, dict[str, torch.Tensor]]


def check_optimizer_state(
    config: InfluenceConfig, optimizer: AdamWState | None, shapes: Mapping[str, tuple[int, ...]]
) -> None:
    """Raise ValueError when the preconditioner needs an optimizer state and it is missing or does not
    fit the parameters that take part (called before any work, so the error names the cause)."""
    if not config.needs_optimizer_state:
        return
    if optimizer is None:
        raise ValueError(
            f"preconditioner {config.preconditioner!r} needs the optimizer state with the weights snapshot "
            "(an AdamWState part; see d3ray.train.scheduling.snapshot)"
        )
    optimizer.check_covers(shapes)


def _moments(config: InfluenceConfig, optimizer: AdamWState | None, params: Params):
    if not config.needs_optimizer_state:
        return None
    first = next(iter(params.values()))
    return optimizer.tensors(params, first.device, first.dtype)


def batch_vectors(
    st: BatchStatistics,
    params: Params,
    config: InfluenceConfig,
    optimizer: AdamWState | None = None,
    moments: tuple[Params, Params] | None = None,
    shards: Shards | None = None,
) -> tuple[float, Vectors]:
    """(η, statistic → name → (1, *shape)) of one batch: g, q = u ⊙ u, h, and u when it is not g."""
    eta, u = step_direction(config.preconditioner, config.gamma, params, st.grad, optimizer, moments, shards)
    out = {"g": {n: t.unsqueeze(0) for n, t in st.grad.items()}}
    if u is not st.grad:
        out["u"] = {n: t.unsqueeze(0) for n, t in u.items()}
    if st.hdiag is not None:
        out["q"] = {n: (t * t).unsqueeze(0) for n, t in u.items()}
        out["h"] = {n: t.unsqueeze(0) for n, t in st.hdiag.items()}
    return eta, out


def sketch_rows(vecs: Vectors, sketch: Sketch, cv: ControlVariate | None, control_variate: bool,
                shards: Shards | None = None) -> dict[str, torch.Tensor]:
    """statistic → (k',) sketch row of one batch, with the control variate when one is given; with
    ``shards`` the vectors are this rank's slices and the rows are summed over ranks (a collective)."""
    stats = list(vecs)
    # One projection of the stacked statistics: the rows/signs of each parameter are looked up once.
    stacked = {n: torch.cat([vecs[s][n] for s in stats]) for n in vecs["g"]}  # name → (len(stats), *shape)
    offsets = None if shards is None else shards.offsets
    projected = reduce_sum(shards, sketch.project(stacked, offsets))  # (len(stats), k)
    sketches = {s: projected[i : i + 1] for i, s in enumerate(stats)}  # stat → (1, k)
    if control_variate:
        if cv is not None:
            sketches = cv.augment(vecs, sketches)
        else:  # no usable reference: zero extra columns keep the width equal across workers
            sketches = {s: torch.nn.functional.pad(t, (0, EXTRA_COLUMNS)) for s, t in sketches.items()}
    return {stat: t[0] for stat, t in sketches.items()}


def sketch_chunk(
    statistics: Iterable[BatchStatistics],
    batch_ids: Sequence[int],
    params: Params,
    config: InfluenceConfig,
    sketch: Sketch,
    *,
    reference: Reference | None = None,
    return_means: bool = False,
    optimizer: AdamWState | None = None,
    shards: Shards | None = None,
) -> BatchSketches:
    """Sketch rows of a share of a chunk (Taylor estimators), with the two-pass control variate.

    Args:
        statistics: per batch, in ``batch_ids`` order, its BatchStatistics; may be a lazy iterator
            (then at most one batch of full-dimension vectors is held when ``reference`` is given).
        batch_ids: ids of the batches (key the rows when merging).
        params: name → parameter tensor that takes part (θ for the weight-decay term of ``adam``).
        config: the run's InfluenceConfig (estimator, preconditioner, γ, control variate).
        sketch: the run's P (``config.sketch.build()``).
        reference: control-variate reference shared by all workers of the chunk; None = this call's mean.
        return_means: also return full-dimension means of the vectors (the next chunk's reference).
        optimizer: the snapshot's optimizer state (needed by ``preconditioner: adam``).
        shards: sharded influence (shards.py): ``statistics``, ``params``, ``optimizer`` and
            ``reference`` hold this rank's slices (losses and ``finite`` already global); every rank
            calls with the same batches and gets the unsharded rows; ``means`` stay this rank's slices.
            Without a reference the control-variate columns are zero (no second pass: keeping a chunk
            of gradient slices would cost L times the memory of one).

    Returns:
        BatchSketches with rows in ``batch_ids`` order; k' = k (+3 with the control variate).

    Raises:
        ValueError: the optimizer state is missing or does not fit ``params``.
    """
    check_optimizer_state(config, optimizer, {n: tuple(p.shape) for n, p in params.items()})
    start = time.perf_counter()
    moments = _moments(config, optimizer, params)
    # drift estimator (potential.py): f_i = ⟨g_i, w⟩ exact, w built once here; the sketch carries u_i − w
    potential = config.estimator.exact_potential and config.needs_optimizer_state
    residual = config.estimator.sketches_residual or not potential
    w = drift_direction(params, optimizer, moments) if potential else None
    f = np.zeros(len(batch_ids), dtype=np.float64)
    deferred = config.control_variate and reference is None and shards is None and residual
    cv = (
        ControlVariate(reference, sketch, next(iter(params.values())).device, next(iter(params.values())).dtype,
                       shards)
        if config.control_variate and reference is not None
        else None
    )
    eta = config.gamma if optimizer is None or not config.needs_optimizer_state else optimizer.lr
    stats_sec = sketch_sec = 0.0
    rows: dict[int, dict[str, torch.Tensor]] = {}
    pending: dict[int, Vectors] = {}
    sums: dict[str, dict[str, torch.Tensor]] = {}
    losses, excluded = [], []
    iterator = iter(statistics)
    for r, bid in enumerate(batch_ids):
        t0 = time.perf_counter()
        st = next(iterator)
        stats_sec += time.perf_counter() - t0
        losses.append(st.loss)
        if not st.finite:
            excluded.append(bid)
            logger.warning("influence: batch %s has a non-finite loss or gradient; excluded", bid)
            continue
        if potential:  # this rank's part; summed over ranks once for the chunk, below
            f[r] = batch_potential(st.grad, w)
        if not residual:  # the potential alone: no step direction, no sketch
            vecs = {"g": {n: t.unsqueeze(0) for n, t in st.grad.items()}}
        else:
            eta, vecs = batch_vectors(st, params, config, optimizer, moments, shards)
            if potential:
                vecs["u"] = drift_residual(vecs["u"], w)
        if return_means or deferred:
            for stat, named in vecs.items():
                acc = sums.setdefault(stat, {})
                for n, t in named.items():
                    acc[n] = acc[n] + t[0] if n in acc else t[0].clone()
        if deferred:
            pending[r] = vecs
            continue
        if not residual:
            continue
        t0 = time.perf_counter()
        rows[r] = sketch_rows(vecs, sketch, cv, config.control_variate, shards)
        sketch_sec += time.perf_counter() - t0
    if potential and shards is not None:  # one all-reduce of the chunk's L partial dot products
        f = reduce_sum(shards, torch.from_numpy(f)).cpu().numpy()
    n_finite = len(batch_ids) - len(excluded)
    means = None
    if sums:
        means = Reference(
            vectors={s: {n: (t / n_finite).cpu().numpy() for n, t in v.items()} for s, v in sums.items()},
            count=n_finite,
        )
    if pending:
        t0 = time.perf_counter()
        cv = ControlVariate(means, sketch, next(iter(params.values())).device, next(iter(params.values())).dtype)
        for r, vecs in pending.items():
            rows[r] = sketch_rows(vecs, sketch, cv, config.control_variate, shards)
        sketch_sec += time.perf_counter() - t0
    width = sketch.dim({n: p.numel() for n, p in params.items()})
    width += EXTRA_COLUMNS if config.control_variate else 0
    width = width if residual else 0  # potential only: rows of width 0, S is the potential alone
    if potential and not np.any(f):
        logger.warning("influence: the AdamW drift potential is zero for every batch (no momentum or weight "
                       "decay yet?): S is the residual alone")
    dtype = next(iter(params.values())).dtype
    out_dtype = np.float64 if dtype == torch.float64 else np.float32
    # Without a curvature estimate Q and H are zero: not shipped (None), the merge takes them as zeros.
    names = ("g",) + (("q", "h") if config.estimator.has_curvature else ()) + (("u",) if config.needs_optimizer_state else ())
    mats = {s: np.zeros((len(batch_ids), width), dtype=out_dtype) for s in names}
    for r, row in rows.items():
        for stat, vec in row.items():
            mats[stat][r] = vec.detach().cpu().numpy()
    ref_id = cv.reference_id if cv is not None else "none"
    sketch_id = _sketch_id(config, params)
    return BatchSketches(
        batch_ids=list(batch_ids),
        G=mats["g"],
        Q=mats.get("q"),
        H=mats.get("h"),
        U=mats.get("u"),
        step_size=float(eta),
        losses=np.asarray(losses, dtype=np.float64),
        excluded=excluded,
        timings={
            "influence/stats_sec": stats_sec,
            "influence/sketch_sec": sketch_sec,
            "influence/total_sec": time.perf_counter() - start,
        },
        estimator=config.estimator.describe(),
        sketch_id=f"{sketch_id}:{ref_id}",
        means=means if return_means else None,
        potential=f if potential else None,
    )


def _sketch_id(config: InfluenceConfig, params: Params) -> int:
    """What P depends on (sketch config, parameter filter, preconditioner, names): parts with other ids
    do not merge."""
    return stable_seed(repr(config.sketch), config.param_filter, config.preconditioner, sorted(params))


def potential_chunk(
    objectives: Sequence[CrossEntropyObjective],
    batch_ids: Sequence[int],
    params: Params,
    config: InfluenceConfig,
    optimizer: AdamWState | None,
    drift: Callable[[], Params] | None = None,
) -> BatchSketches:
    """The drift potential alone (``drift``, ``residual: none``, ``potential: jvp | step``) of a share of a chunk.

    The same BatchSketches as :func:`sketch_chunk` gives this estimator (rows of width 0, ``potential``
    f, the losses, the excluded batches) with f from :func:`~d3ray.influence.drift.batched_potentials`
    (``jvp``: d/dε ℓ_i(θ + ε·w); ``step``: (ℓ_i(θ) − ℓ_i(θ − η·w)) / η): every batch of the call in
    batched passes instead of one forward + backward per batch. A batch whose loss or f is not finite is
    excluded (f = 0) and logged. Before the optimizer's first step ``step`` gives f = 0 for every batch: w is
    then λθ alone, whose step changes the losses by about their float32 rounding (``jvp`` keeps λ⟨g_i, θ⟩).

    ``drift``: a function that returns w of eq. P1 by name, whole, where the caller assembles it (the
    trainers, from their ZeRO partitions: ``train/scheduling/snapshot.py: gathered_drift``; called after
    the forwards at θ); ``optimizer`` then gives only the step size, and its moments are not read.

    Raises:
        ValueError: the optimizer state is missing or does not fit ``params``; the drift misses a parameter
            or has another shape.
    """
    shapes = {n: tuple(p.shape) for n, p in params.items()}
    if drift is None:
        check_optimizer_state(config, optimizer, shapes)
    elif optimizer is None:
        raise ValueError("potential_chunk: a drift needs the optimizer state's step size")
    start = time.perf_counter()

    def checked_drift() -> Params:
        w = drift()
        odd = [n for n, shape in shapes.items() if n not in w or tuple(w[n].shape) != shape]
        if odd:
            raise ValueError(f"potential_chunk: the drift w does not fit the parameters {odd[:5]}")
        return w

    w = drift_direction(params, optimizer, _moments(config, optimizer, params)) if drift is None else checked_drift
    # at lr 0 the drift step moves nothing (and S = lr·(f_j − f_i) is 0 whatever f): the derivative then
    method = config.estimator.potential if optimizer.lr > 0 else "jvp"
    losses, f = batched_potentials(objectives, params, w, config.estimator.tokens_per_pass, method, optimizer.lr)
    finite = np.isfinite(losses) & np.isfinite(f)
    excluded = [bid for bid, ok in zip(batch_ids, finite, strict=True) if not ok]
    for bid in excluded:
        logger.warning("influence: batch %s has a non-finite loss or potential; excluded", bid)
    f = np.where(finite, f, 0.0)
    if method == "step" and optimizer.step == 0:
        # Before the first step m = 0 and w = λθ: the step moves each weight by η·λ relative, and ℓ_i by about
        # the float32 rounding of ℓ_i itself (the seeded default run's f were small whole multiples of one
        # rounding unit, their order differing between two CPUs). No potential then: f = 0, the stream order.
        f = np.zeros_like(f)
    if not np.any(f):  # expected before the first step (no momentum yet)
        logger.log(logging.INFO if optimizer.step == 0 else logging.WARNING,
                   "influence: the AdamW drift potential is zero for every batch (no momentum or weight decay "
                   "yet?): S is zero")
    empty = np.zeros((len(batch_ids), 0), dtype=np.float64 if config.dtype == "float64" else np.float32)
    sketch_id = _sketch_id(config, params)
    seconds = time.perf_counter() - start
    return BatchSketches(
        batch_ids=list(batch_ids), G=empty, Q=None, H=None, U=empty.copy(), step_size=float(optimizer.lr),
        losses=losses, excluded=excluded,
        timings={"influence/stats_sec": seconds, "influence/sketch_sec": 0.0, "influence/total_sec": seconds},
        estimator=config.estimator.describe(), sketch_id=f"{sketch_id}:none", potential=f,
    )


def lookahead_rows(
    objectives: Sequence[CrossEntropyObjective],
    batch_ids: Sequence[int],
    params: Params,
    config: InfluenceConfig,
    *,
    rows: Sequence[int] | None = None,
    optimizer: AdamWState | None = None,
    gamma: float | None = None,
) -> LookaheadRows:
    """Exact look-ahead rows I[i → j] = ℓ(B_j; θ + Δθ_i) − ℓ(B_j; θ) with the configured step.

    Args:
        objectives, batch_ids: all L batches of the chunk (the columns) and their ids.
        params: name → leaf tensor with requires_grad (the parameters that take the step).
        config: the run's InfluenceConfig (preconditioner, γ).
        rows: ids of the batches i to compute (default all).
        optimizer: the snapshot's optimizer state (``preconditioner: adam``).
        gamma: γ of the plain step (default ``config.gamma``); here γ changes the result.

    Raises:
        ValueError: the optimizer state is missing or does not fit ``params``; a row id is unknown.
    """
    check_optimizer_state(config, optimizer, {n: tuple(p.shape) for n, p in params.items()})
    start = time.perf_counter()
    gamma = config.gamma if gamma is None else gamma
    moments = _moments(config, optimizer, params)

    def step(g: Params) -> Params:
        eta, u = step_direction(config.preconditioner, gamma, params, g, optimizer, moments)
        return {n: -eta * t for n, t in u.items()}

    row_ids = list(batch_ids) if rows is None else list(rows)
    pos = {b: t for t, b in enumerate(batch_ids)}
    unknown = [b for b in row_ids if b not in pos]
    if unknown:
        raise ValueError(f"lookahead rows {unknown} are not among the chunk's batch ids")
    A_rows, base, row_finite = lookahead_influence(objectives, params, step, [pos[b] for b in row_ids])
    losses = base.detach().cpu().numpy().astype(np.float64)
    excluded = [b for b, loss in zip(batch_ids, losses, strict=True) if not np.isfinite(loss)]
    excluded += [b for b, ok in zip(row_ids, row_finite.tolist(), strict=True) if not ok and b not in excluded]
    return LookaheadRows(
        batch_ids=list(batch_ids),
        row_ids=row_ids,
        A_rows=A_rows.detach().cpu().numpy().astype(np.float64),
        losses=losses,
        excluded=excluded,
        timings={"influence/total_sec": time.perf_counter() - start},
    )


def parameter_names(named: Iterable[str], param_filter: str | None) -> list[str]:
    """Names that take part: all, or those matching ``param_filter`` (re.search)."""
    pattern = re.compile(param_filter) if param_filter else None
    return [n for n in named if pattern is None or pattern.search(n)]
