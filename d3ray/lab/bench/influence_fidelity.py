"""How close an estimated S comes to a reference S: what ``d3ray bench influence`` and its ``--snapshot-dtype``
section (``influence_snapshot.py``) report per chunk, and the median over chunks that skips missing values;
and the scoring of every estimator variant of one weights snapshot against the reference through the
production path (:func:`score_variants`), with its sketch-free value (:func:`full_dimension_S`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from d3ray.lab.bench.influence_variants import PROBES, estimator_config, preconditioners, variant_label


def _offdiag(S: np.ndarray) -> np.ndarray:
    return S[~np.eye(S.shape[0], dtype=bool)]


def fidelity(S_est: np.ndarray, S_ref: np.ndarray) -> tuple[float | None, float | None]:
    """(Spearman of off-diagonal entries, normalised regret of the exact order of S_est under S_ref)."""
    from scipy.stats import spearmanr

    from d3ray.solver.exact import solve_exact
    from d3ray.solver.problem import ordering_cost

    rho = None
    if np.ptp(_offdiag(S_est)) > 0 and np.ptp(_offdiag(S_ref)) > 0:
        rho = float(spearmanr(_offdiag(S_est), _offdiag(S_ref))[0])
    best = solve_exact(S_ref)[1]
    random_mean = 0.5 * float(np.maximum(S_ref, 0).sum())  # each pair violated with probability 1/2
    if random_mean - best <= 0:
        return rho, None
    # An all-zero S carries no preference: the order falls back to the initial one.
    order = np.arange(S_est.shape[0]) if not np.any(S_est) else solve_exact(S_est)[0]
    return rho, (ordering_cost(S_ref, order) - best) / (random_mean - best)


def median(values) -> float | None:
    """The median of the values that are not None; None when there are none."""
    values = [v for v in values if v is not None]
    return float(np.median(values)) if values else None


def chunk_scores(S_est: np.ndarray, S_ref: np.ndarray, L: int) -> dict[int, list[tuple]]:
    """Fidelity on the whole chunk and on each of its halves: {L: [...], L/2: [...]}."""
    half = L // 2
    return {
        L: [fidelity(S_est, S_ref)],
        half: [fidelity(S_est[sl, sl], S_ref[sl, sl]) for sl in (slice(0, half), slice(half, L))],
    }


def full_dimension_S(stats: list, params: dict, config, optimizer) -> np.ndarray:
    """S of full-dimension statistics (no sketch), in float64: the sketch-free value of a variant."""
    import torch

    from d3ray.influence.chunk import batch_vectors

    first = next(iter(params.values()))
    moments = optimizer.tensors(params, first.device, first.dtype) if config.needs_optimizer_state else None
    vecs = [batch_vectors(st, params, config, optimizer, moments) for st in stats]
    eta = vecs[0][0]

    def gram(a: str, b: str) -> np.ndarray:
        flat_a = torch.stack([torch.cat([v[1][a][n].reshape(-1) for n in params]).double() for v in vecs])
        flat_b = torch.stack([torch.cat([v[1][b][n].reshape(-1) for n in params]).double() for v in vecs])
        return (flat_a @ flat_b.T).numpy()

    S = 0.5 * eta**2 * (gram("h", "q") - gram("q", "h")) if "h" in vecs[0][1] else np.zeros((len(vecs),) * 2)
    if "u" in vecs[0][1]:
        F = gram("u", "g")  # F[i, j] = ⟨u_i, g_j⟩
        S = S - eta * (F.T - F)
    return S


def score_variants(model, cfg_dict, snap, parts, chunks, S_ref, base, todo, args) -> list[dict[str, Any]]:
    """Records of each (variant, preconditioner) in ``todo`` at ``base``'s fraction/filter: fidelity of its S
    against the reference look-ahead ``S_ref`` and against its own full-dimension S, per chunk (chunk 0 only
    sets the first reference of the control variate)."""
    import torch

    from d3ray.influence.chunk import sketch_chunk
    from d3ray.influence.estimators import FirstOrderConfig, hutchinson_samples
    from d3ray.influence.estimators.gnb import mean_of
    from d3ray.influence.statistics import BatchStatistics, all_finite
    from d3ray.influence.worker import InfluenceWorker

    L, ids = args.chunk, list(range(args.chunk))
    worker = InfluenceWorker(cfg_dict, replace(base, estimator=FirstOrderConfig()))
    worker.load_weights(parts)
    sketch = base.sketch.build()
    families: dict[str, list[int]] = {}
    for est, n in todo:
        families.setdefault(est, []).append(n)
    scores: dict[tuple, list] = {}
    references: dict[tuple, Any] = {}
    for c in range(args.chunks + 1):
        params = worker.leaves()
        for est, probe_list in families.items():
            # statistics of each batch once per family; hutchinson: prefix means of 8 probes
            per_variant: dict[int, list] = {n: [] for n in probe_list}
            for b, bid in zip(chunks[c], ids, strict=True):
                obj, gen = worker.objective(b, bid), worker.generator(bid)
                if est == "hutchinson":
                    loss, g, draws = hutchinson_samples(obj.loss, params, max(probe_list), gen)
                    for n in probe_list:
                        h = mean_of(draws[:n])
                        ok = bool(torch.isfinite(loss)) and all_finite(g) and all_finite(h)
                        per_variant[n].append(BatchStatistics(float(loss), g, h, ok))
                else:
                    per_variant[0].append(estimator_config(est, 0).statistics(obj, params, gen))
            for n, stats in per_variant.items():
                shared_ok = est in ("fisher", "hutchinson") and n in (0, max(PROBES))
                kinds = [False, True] if shared_ok else [False]
                for shared in kinds:
                    st_list = shared_hessian(stats) if shared else stats
                    for pre in preconditioners(est):
                        key = (variant_label(est, n, shared), pre)
                        cfg = replace(base, estimator=estimator_config(est, n), preconditioner=pre)
                        out = sketch_chunk(
                            st_list, ids, params, cfg, sketch, reference=references.get(key),
                            return_means=True, optimizer=snap.optimizer,
                        )
                        references[key] = out.means
                        if c == 0:
                            continue
                        S = cfg.estimator.merge([out], ids)[1]
                        S_full = full_dimension_S(st_list, params, cfg, snap.optimizer)
                        acc = scores.setdefault(key, {"look": [], "sketch": []})
                        acc["look"].append(chunk_scores(S, S_ref[c], L))
                        acc["sketch"].append(chunk_scores(S, S_full, L))
    return [
        fidelity_record(model, snap, label, pre, base.sample_fraction, base.param_filter or "none",
                merge_scores(acc["look"]), merge_scores(acc["sketch"]))
        for (label, pre), acc in scores.items()
    ]


def shared_hessian(stats: list) -> list:
    """The same statistics with every batch's h replaced by the chunk mean of h (one estimate per chunk)."""
    from d3ray.influence.statistics import BatchStatistics

    finite = [st for st in stats if st.finite and st.hdiag is not None]
    mean = {n: sum(st.hdiag[n] for st in finite) / len(finite) for n in finite[0].hdiag}
    return [BatchStatistics(st.loss, st.grad, mean, st.finite) for st in stats]


def merge_scores(per_chunk: list[dict[int, list[tuple]]]) -> dict[int, dict[str, Any]]:
    """Per L, the Spearman and regret values of every chunk together."""
    out: dict[int, dict[str, Any]] = {}
    for chunk in per_chunk:
        for L, pairs in chunk.items():
            acc = out.setdefault(L, {"spearman": [], "regret": []})
            acc["spearman"] += [r for r, _ in pairs]
            acc["regret"] += [g for _, g in pairs]
    return out


def fidelity_record(model, snap, label, pre, frac, pfilter, look, sketch) -> dict[str, Any]:
    """One record: medians over chunks of the fidelity to the reference (``look``) and to the full-dimension S."""
    rec: dict[str, Any] = {
        "model": model, "steps": snap.steps, "train_loss": snap.loss, "variant": label,
        "preconditioner": pre, "sample_fraction": frac, "param_filter": pfilter,
    }
    for L, acc in look.items():
        rec[f"spearman_L{L}"] = median(acc["spearman"])
        rec[f"regret_L{L}"] = median(acc["regret"])
        rec[f"regret_L{L}_all"] = acc["regret"]
    for L, acc in sketch.items():
        rec[f"sketch_regret_L{L}"] = median(acc["regret"])
    return rec
