"""The census's numbers, from the branch files alone: per chunk, across chunks, and the two positive controls.

Per chunk (metric: the mean held-out loss over the run's in-domain eval sets, lower is better):
the sd of the R random orders' losses (how much order matters here), each marked order's z-score
against them and its rank among them (1 = better than every random order); the correlation, over every
branch of the chunk, between the solver's objective of the order (``ordering_cost`` on the chunk's S:
the backward positive weight D3 minimises) and the held-out loss; with all L! orders, each marked
order's regret against the true best one (:func:`all_orders_summary`). Across chunks: each marked
order's mean z with a 95% t-interval and the share of chunks where it beats the median random order.

The positive controls: :func:`recency_control` (the planted recency effect of ``--control recency``) and
:func:`planted_control` (the planted batch's position, ``--control planted``). ``report.py`` renders what
these return.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from d3ray.lab.census.census import mean_loss, read_json
from d3ray.lab.census.stats import (
    beats_median,
    domain_position,
    half_of,
    pearson,
    position_effect,
    rank_among,
    spearman,
    t_interval,
    t_statistic,
    z_score,
)

MARKED = ("d3", "d3_reverse", "d3_alternate", "lookahead", "lookahead_reverse", "lookahead_alternate", "stream", "run",
          "recency_last", "recency_first", "planted_first", "planted_last")
"""The orders the report scores against the random ones (those a chunk has)."""


def collect(out: Path) -> dict[tuple[int, int], dict[str, Any]]:
    """(checkpoint, chunk) → ``{"orders": orders.json, "branches": name → branch result}`` from ``out``."""
    found: dict[tuple[int, int], dict[str, Any]] = {}
    for cdir in sorted(Path(out).glob("branches/k*/c*")):
        key = (int(cdir.parent.name[1:]), int(cdir.name[1:]))
        branches: dict[str, Any] = {}
        for f in sorted(cdir.glob("*.json")):
            if f.name == "orders.json":
                continue
            result = json.loads(f.read_text())
            for name in result["names"]:
                branches[name] = result
        found[key] = {"orders": read_json(cdir / "orders.json") or {}, "branches": branches}
    return found


def chunk_summary(entry: dict[str, Any], key: str = "eval") -> dict[str, Any]:
    """The per-chunk statistics of one chunk's branches (see the module docstring)."""
    from d3ray.solver import ordering_cost

    branches = entry["branches"]
    losses = {name: mean_loss(r, key) for name, r in branches.items()}
    random = [v for n, v in losses.items() if n.startswith("random_")]
    out: dict[str, Any] = {
        "losses": losses,
        "random_mean": float(np.nanmean(random)) if random else float("nan"),
        "random_sd": float(np.nanstd(random, ddof=1)) if len(random) > 1 else float("nan"),
        "random_n": int(np.isfinite(random).sum()),
        "failed": sorted(n for n, r in branches.items() if r.get("status") != "ok"),
        "marked": {},
    }
    for name in MARKED:
        if name in losses:
            v = losses[name]
            out["marked"][name] = {"loss": v, "z": z_score(v, random), "rank": rank_among(v, random),
                                   "beats_median": beats_median(v, random)}
    distinct = {tuple(r["order"]): mean_loss(r, key) for r in branches.values()}
    for label, s_key in (("objective", "S"), ("lookahead_objective", "lookahead_S")):
        S = entry["orders"].get(s_key)
        if S is None or not distinct:
            continue
        S = np.asarray(S, dtype=np.float64)
        if not np.isfinite(S).all():
            continue
        costs = [ordering_cost(S, np.asarray(o)) for o in distinct]
        out[label] = {"pearson": pearson(costs, list(distinct.values())),
                      "spearman": spearman(costs, list(distinct.values())),
                      "n": int(np.isfinite(list(distinct.values())).sum())}
    exhaustive = all_orders_summary(branches, key)
    if exhaustive:
        out["exhaustive"] = exhaustive
    return out


def all_orders_summary(branches: dict[str, Any], key: str = "eval") -> dict[str, Any] | None:
    """With all L! orders trained (``perm_*``): the true best order and how far each marked order is from it.

    ``best``/``median``/``worst``: the held-out loss over the finished permutations; per marked order its
    ``regret`` (its loss − the best) and ``share_better`` (the fraction of all orders strictly better: 0 = it
    is the best order, 0.5 = a median one); ``random_regret``: the mean over all orders − the best (the
    expected regret of a uniformly random order, what an ordering must beat). None without permutations."""
    perms = [r for n, r in branches.items() if n.startswith("perm_")]
    losses = np.asarray([mean_loss(r, key) for r in perms], dtype=np.float64)
    finite = losses[np.isfinite(losses)]
    if not len(finite):
        return None
    best = float(finite.min())
    out: dict[str, Any] = {"orders": len(finite), "failed": int(len(losses) - len(finite)), "best": best,
                           "best_order": list(perms[int(np.nanargmin(losses))]["order"]), "median": float(np.median(finite)),
                           "worst": float(finite.max()), "random_regret": float(finite.mean()) - best, "marked": {}}
    for name in MARKED:
        if name in branches:
            v = mean_loss(branches[name], key)
            out["marked"][name] = {"regret": v - best if math.isfinite(v) else float("nan"),
                                   "share_better": float((finite < v).mean()) if math.isfinite(v) else float("nan")}
    return out


def across_exhaustive(summaries: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Across the chunks trained in all L! orders: the mean spread (worst − best), the mean regret of a
    random order, and per marked order the mean regret and mean share of orders better, with 95%
    t-intervals. None when no chunk has them."""
    rows = [s["exhaustive"] for s in summaries if "exhaustive" in s]
    if not rows:
        return None
    out: dict[str, Any] = {"chunks": len(rows), "mean_range": float(np.mean([r["worst"] - r["best"] for r in rows])),
                           "random_regret": dict(zip(("mean", "ci_low", "ci_high"),
                                                     t_interval([r["random_regret"] for r in rows]), strict=True))}
    for name in MARKED:
        marked = [r["marked"][name] for r in rows if name in r["marked"]]
        if marked:
            out[name] = {stat: dict(zip(("mean", "ci_low", "ci_high"), t_interval([m[stat] for m in marked]), strict=True))
                         for stat in ("regret", "share_better")}
            out[name]["n"] = len(marked)
    return out


def across_chunks(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Each marked order's mean z with its 95% t-interval and share of chunks beating the median random
    order; the mean random sd; the mean objective correlations."""
    summaries = [s for s in summaries if s["random_n"] >= 2]  # chunks with a spread (others not trained yet)
    out: dict[str, Any] = {"chunks": len(summaries),
                           "mean_random_sd": float(np.mean([s["random_sd"] for s in summaries])) if summaries else float("nan")}
    for name in MARKED:
        zs = [s["marked"][name]["z"] for s in summaries if name in s["marked"]]
        if not zs:
            continue
        mean, lo, hi = t_interval(zs)
        wins = [s["marked"][name]["beats_median"] for s in summaries if name in s["marked"]]
        out[name] = {"mean_z": mean, "ci_low": lo, "ci_high": hi, "n": len(zs),
                     "share_beats_median": float(np.mean(wins))}
    for label in ("objective", "lookahead_objective"):
        rs = [s[label]["pearson"] for s in summaries if label in s]
        if rs:
            mean, lo, hi = t_interval(rs)
            out[label] = {"mean_pearson": mean, "ci_low": lo, "ci_high": hi, "n": len(rs),
                          "mean_spearman": float(np.nanmean([s[label]["spearman"] for s in summaries if label in s]))}
    return out


def recency_control(entries: dict[tuple[int, int], dict[str, Any]], domain: str | None,
                    metric: str = "eval") -> dict[str, Any]:
    """The recency control: per chunk, the control domain's held-out loss of ``recency_last`` and
    ``recency_first`` against the random orders' (z, rank); across chunks the mean z with its 95%
    t-interval and the share of chunks with z <= -2 (last) / >= 2 (first).

    ``found``: the census sees the known answer, recency_last < random < recency_first: the mean z of
    recency_last has its interval below 0 and that of recency_first above 0 (each |t| >= ~2 over the
    chunks). ``strict``: besides, the mean z of recency_last is <= -2, i.e. the domain's place explains most
    of the random orders' spread in a typical chunk (a bar on the effect's size, not on the census's sight:
    under a loss linear in the domain's positions no order reaches |z| > √(L − 1)). ``position``: the same
    question asked of every trained order (:func:`position_summary`).

    ``metric``: ``eval`` (right after the branched chunk) or ``persist_eval`` (after the shared persist
    chunks). The horizon matters under AdamW: a batch's gradient reaches the weights through the
    momentum, a fraction 1 − β1^n of it after n steps (:func:`~d3ray.lab.census.stats.momentum_applied`), so
    right after the chunk the last batches are the least applied."""
    from d3ray.lab.census.orders import control_domain

    chunks: dict[str, Any] = {}
    for (K, c), entry in sorted(entries.items()):
        domains = entry["orders"].get("batch_domains")
        if not domains or "recency_last" not in entry["branches"]:
            continue
        name = control_domain(domains, domain)
        key = f"{name}/loss"

        def loss(result: dict[str, Any], key: str = key) -> float:
            if result.get("status") != "ok" or metric not in result:
                return float("nan")
            return float(result[metric].get(key, float("nan")))

        random = [loss(r) for n, r in entry["branches"].items() if n.startswith("random_")]
        row: dict[str, Any] = {"domain": name, "random_mean": float(np.nanmean(random)),
                               "random_sd": float(np.nanstd(random, ddof=1))}
        trained = [r for r in entry["branches"].values() if "order" in r and math.isfinite(loss(r))]
        where = [domain_position(r["order"], domains, name) for r in trained]
        losses = [loss(r) for r in trained]
        row["position"] = {"n": len(trained), "spearman": spearman(where, losses), "pearson": pearson(where, losses)}
        for order in ("recency_last", "recency_first", "d3"):
            if order in entry["branches"]:
                v = loss(entry["branches"][order])
                row[order] = {"loss": v, "z": z_score(v, random), "rank": rank_among(v, random)}
        chunks[f"{K}/{c}"] = row
    out: dict[str, Any] = {"chunks": chunks}
    for order, sign in (("recency_last", -1), ("recency_first", 1)):
        zs = [r[order]["z"] for r in chunks.values() if order in r]
        if zs:
            mean, lo, hi = t_interval(zs)
            out[order] = {"mean_z": mean, "ci_low": lo, "ci_high": hi, "n": len(zs), "t": t_statistic(zs),
                          "share_past_2": float(np.mean([sign * z >= 2 for z in zs]))}
    last, first = out.get("recency_last"), out.get("recency_first")
    out["found"] = bool(last and first and math.isfinite(last["ci_high"]) and last["ci_high"] < 0
                        and math.isfinite(first["ci_low"]) and first["ci_low"] > 0)
    out["strict"] = bool(out["found"] and last["mean_z"] <= -2)
    # where every trained order put the domain against its loss: "late" better is the recency answer
    out["position"] = position_summary([r["position"] for r in chunks.values()], ("spearman", "pearson"))
    return out


def position_summary(per_chunk: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[str, Any]:
    """Across chunks, a position effect read per chunk (a Spearman correlation between where something is
    trained, 1..L, and the held-out loss, and the other ``keys``): each key's mean with its 95% t-interval;
    ``resolved`` when the Spearman interval excludes 0 (the census sees the position move the loss);
    ``better`` = ``"late"`` when later lowers the loss (mean Spearman < 0), ``"early"`` when earlier does.
    The planted batch's position (:func:`planted_control`) and the recency domain's
    (:func:`~d3ray.lab.census.stats.domain_position`, :func:`recency_control`) are both read this way."""
    out: dict[str, Any] = {}
    for key in keys:
        values = [r[key] for r in per_chunk]
        mean, lo, hi = t_interval(values)
        out[key] = {"mean": mean, "ci_low": lo, "ci_high": hi, "n": int(np.isfinite(values).sum()) if values else 0}
    rho = out["spearman"]
    out["resolved"] = bool(math.isfinite(rho["ci_low"]) and (rho["ci_low"] > 0 or rho["ci_high"] < 0))
    out["better"] = None if not math.isfinite(rho["mean"]) or rho["mean"] == 0 else (
        "late" if rho["mean"] < 0 else "early")
    return out


PLANTED_PLACED = ("d3", "d3_reverse", "lookahead", "lookahead_reverse", "planted_first", "planted_last")
"""The orders whose placement of the planted batch the planted control reports."""


def planted_control(entries: dict[tuple[int, int], dict[str, Any]], L: int) -> dict[str, Any]:
    """The planted-batch control: per chunk (one batch planted, ``orders.json`` ``planted``), the held-out
    loss against the planted batch's position (1..L) over the random orders (and ``perm_*``):
    :func:`~d3ray.lab.census.stats.position_effect` (Spearman, Pearson, early- and late-half means, the better
    half), and where D3, its reverse, the look-ahead and the two control orders put the batch (position,
    half, and z of their loss against the random orders). Across chunks: the mean Spearman and Pearson
    and the mean late − early difference with 95% t-intervals; ``found`` when the Spearman interval
    excludes 0 (the census sees the position effect), ``better`` its sign; the share of chunks where D3
    put the batch in the half that chunk's random orders found better (``d3_better_side``) and in the
    half the census found better across chunks (``d3_found_side``, only when found)."""
    chunks: dict[str, Any] = {}
    for (K, c), entry in sorted(entries.items()):
        plant = entry["orders"].get("planted")
        if not plant:
            continue
        index = int(plant["index"])
        reference = [r for n, r in entry["branches"].items() if n.startswith(("random_", "perm_"))]
        positions = [list(r["order"]).index(index) + 1 for r in reference]
        losses = [mean_loss(r) for r in reference]
        row: dict[str, Any] = {"planted_batch": index, "kind": plant["kind"], "positions": positions, "losses": losses,
                               **position_effect(positions, losses, L)}
        orders = dict(entry["orders"])
        for name in ("d3", "lookahead"):  # computed but perhaps not trained (yet)
            if orders.get(name) is not None:
                orders[f"{name}_reverse"] = list(reversed(orders[name]))
        for name in PLANTED_PLACED:
            branch = entry["branches"].get(name)
            order = branch["order"] if branch is not None else orders.get(name)
            if order is None:
                continue
            position = list(order).index(index) + 1
            loss = mean_loss(branch) if branch is not None else float("nan")
            row[name] = {"position": position, "side": half_of(position, L), "loss": loss, "z": z_score(loss, losses)}
        for name in ("d3", "d3_reverse", "lookahead"):
            if name in row:
                row[name]["better_side"] = None if row["better"] is None else row[name]["side"] == row["better"]
        chunks[f"{K}/{c}"] = row
    effect = position_summary(list(chunks.values()), ("spearman", "pearson", "late_minus_early"))
    out: dict[str, Any] = {"chunks": chunks, "L": L, "n": len(chunks), "found": effect.pop("resolved"), **effect}
    for name in ("d3", "d3_reverse", "lookahead"):
        per_chunk = [r[name]["better_side"] for r in chunks.values() if name in r and r[name]["better_side"] is not None]
        sides = [r[name]["side"] for r in chunks.values() if name in r]
        if not sides:
            continue
        out[name] = {"better_side": float(np.mean(per_chunk)) if per_chunk else float("nan"),
                     "better_side_n": len(per_chunk),
                     "found_side": float(np.mean([s == out["better"] for s in sides])) if out["found"] else float("nan"),
                     "mean_position": float(np.mean([r[name]["position"] for r in chunks.values() if name in r])),
                     "n": len(sides)}
    for name in ("planted_first", "planted_last"):
        zs = [r[name]["z"] for r in chunks.values() if name in r]
        if zs:
            mean, lo, hi = t_interval(zs)
            out[name] = {"mean_z": mean, "ci_low": lo, "ci_high": hi, "n": int(np.isfinite(zs).sum())}
    return out
