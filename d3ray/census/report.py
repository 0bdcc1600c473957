"""The census report, rebuilt from the branch files alone: ``census.json``, ``results.md``, one PNG per
checkpoint.

Per chunk (metric: the mean held-out loss over the run's in-domain eval sets, lower is better):
the sd of the R random orders' losses (how much order matters here), each marked order's z-score
against them and its rank among them (1 = better than every random order); the correlation, over every
branch of the chunk, between the solver's objective of the order (``ordering_cost`` on the chunk's S:
the backward positive weight D3 minimises) and the held-out loss; with all L! orders, D3's regret
against the best one. Across chunks: each marked order's mean z with a 95% t-interval and the share of
chunks where it beats the median random order.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from d3ray.census.census import mean_loss, read_json
from d3ray.census.stats import (
    beats_median,
    half_of,
    pearson,
    position_effect,
    rank_among,
    spearman,
    t_interval,
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
    perms = [v for n, v in losses.items() if n.startswith("perm_")]
    if perms and "d3" in losses:
        out["d3_regret"] = losses["d3"] - float(np.nanmin(perms))
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


def recency_control(entries: dict[tuple[int, int], dict[str, Any]], domain: str | None) -> dict[str, Any]:
    """The recency control: per chunk, the control domain's held-out loss of ``recency_last`` and
    ``recency_first`` against the random orders' (z, rank); across chunks the mean z with its 95%
    t-interval and the share of chunks with z <= -2 (last) / >= 2 (first). ``found``: the census sees
    the planted effect (mean z of recency_last <= -2, its interval below 0)."""
    from d3ray.census.orders import control_domain

    chunks: dict[str, Any] = {}
    for (K, c), entry in sorted(entries.items()):
        domains = entry["orders"].get("batch_domains")
        if not domains or "recency_last" not in entry["branches"]:
            continue
        name = control_domain(domains, domain)
        key = f"{name}/loss"

        def loss(result: dict[str, Any], key: str = key) -> float:
            return float(result["eval"].get(key, float("nan"))) if result.get("status") == "ok" else float("nan")

        random = [loss(r) for n, r in entry["branches"].items() if n.startswith("random_")]
        row: dict[str, Any] = {"domain": name, "random_mean": float(np.nanmean(random)),
                               "random_sd": float(np.nanstd(random, ddof=1))}
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
            out[order] = {"mean_z": mean, "ci_low": lo, "ci_high": hi, "n": len(zs),
                          "share_past_2": float(np.mean([sign * z >= 2 for z in zs]))}
    last = out.get("recency_last")
    out["found"] = bool(last and last["mean_z"] <= -2 and math.isfinite(last["ci_high"]) and last["ci_high"] < 0)
    return out


PLANTED_PLACED = ("d3", "d3_reverse", "lookahead", "lookahead_reverse", "planted_first", "planted_last")
"""The orders whose placement of the planted batch the planted control reports."""


def planted_control(entries: dict[tuple[int, int], dict[str, Any]], L: int) -> dict[str, Any]:
    """The planted-batch control: per chunk (one batch planted, ``orders.json`` ``planted``), the held-out
    loss against the planted batch's position (1..L) over the random orders (and ``perm_*``):
    :func:`~d3ray.census.stats.position_effect` (Spearman, Pearson, early- and late-half means, the better
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
    out: dict[str, Any] = {"chunks": chunks, "L": L, "n": len(chunks)}
    for key in ("spearman", "pearson", "late_minus_early"):
        mean, lo, hi = t_interval([r[key] for r in chunks.values()])
        out[key] = {"mean": mean, "ci_low": lo, "ci_high": hi,
                    "n": int(np.isfinite([r[key] for r in chunks.values()]).sum()) if chunks else 0}
    rho = out["spearman"]
    out["found"] = bool(math.isfinite(rho["ci_low"]) and (rho["ci_low"] > 0 or rho["ci_high"] < 0))
    out["better"] = None if not math.isfinite(rho["mean"]) or rho["mean"] == 0 else (
        "early" if rho["mean"] > 0 else "late")
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


def _f(x: Any, digits: int = 4) -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{digits}f}"


def write_report(out: Path, command: str, setup: dict[str, Any]) -> dict[str, Any]:
    """Write ``census.json``, ``results.md`` and ``k<K>.png`` under ``out`` from the branch files."""
    out = Path(out)
    entries = collect(out)
    keys = sorted(entries)
    metrics = ["eval"] + (["persist_eval"] if setup.get("persist") else [])
    report: dict[str, Any] = {"command": command, "setup": setup, "chunks": {}, "summary": {}, "reproduction": []}
    trained = {id(r): r for e in entries.values() for r in e["branches"].values()}.values()
    report["compute"] = {"branches": len(trained),
                         "branch_seconds": float(sum(r.get("seconds", 0.0) for r in trained)),
                         "branch_cpu_seconds": float(sum(r.get("cpu_seconds", 0.0) for r in trained)),
                         "orders_seconds": float(sum(e["orders"].get("seconds", 0.0) for e in entries.values()))}
    for metric in metrics:
        summaries = []
        for K, c in keys:
            summary = chunk_summary(entries[(K, c)], metric)
            report["chunks"].setdefault(f"{K}/{c}", {})[metric] = summary
            summaries.append(summary)
        report["summary"][metric] = across_chunks(summaries)
    for (K, c), entry in sorted(entries.items()):
        for name, result in entry["branches"].items():
            if name == "run" and "reproduction" in result:
                r = result["reproduction"]
                report["reproduction"].append({"from_checkpoint": K, "chunk": c, "against": r["checkpoint"],
                                               "max_abs_diff": r["max_abs_diff"], "close": r["close"],
                                               "tensors": r["tensors"]})
    if setup.get("control") == "recency":
        report["control"] = {"recency": recency_control(entries, setup.get("control_domain"))}
    if setup.get("control") == "planted":
        report["control"] = {"planted": planted_control(entries, int(setup["L"]))}
    (out / "census.json").write_text(json.dumps(report, indent=1))
    plots = plot_checkpoints(out, entries)
    (out / "results.md").write_text(markdown(report, plots))
    return report


def plot_checkpoints(out: Path, entries: dict[tuple[int, int], dict[str, Any]]) -> list[str]:
    """Per checkpoint: each chunk's random-order losses (dots, relative to their median) with D3, its
    reverse, the alternating order, the look-ahead's D3 and the stream and run orders marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    styles = {"d3": ("tab:red", "o"), "d3_reverse": ("tab:blue", "v"), "d3_alternate": ("tab:green", "s"),
              "lookahead": ("tab:purple", "D"), "stream": ("black", "x"), "run": ("tab:orange", "+")}
    names = []
    for K in sorted({k for k, _ in entries}):
        chunks = sorted(c for k, c in entries if k == K)
        fig, ax = plt.subplots(figsize=(max(5.0, 0.45 * len(chunks) + 2.5), 4.0))
        labelled: set[str] = set()
        for x, c in enumerate(chunks):
            losses = {n: mean_loss(r) for n, r in entries[(K, c)]["branches"].items()}
            random = np.asarray([v for n, v in losses.items() if n.startswith("random_") or n.startswith("perm_")])
            if not np.isfinite(random).any():
                continue  # not trained yet: no reference to draw against
            mid = float(np.nanmedian(random))
            ax.scatter(np.full(len(random), x), random - mid, s=10, color="0.6", zorder=1,
                       label=None if "random" in labelled else "random orders")
            labelled.add("random")
            for k, (name, (color, marker)) in enumerate(styles.items()):
                if name in losses:
                    ax.scatter([x + 0.08 * (k + 1)], [losses[name] - mid], color=color, marker=marker, s=30, zorder=2,
                               label=None if name in labelled else name)
                    labelled.add(name)
        ax.axhline(0.0, color="0.8", lw=0.8, zorder=0)
        ax.set_xticks(range(len(chunks)), [str(c) for c in chunks], fontsize=7)
        ax.set_xlabel("chunk")
        ax.set_ylabel("held-out mean loss − median of random orders (nats)")
        ax.set_title(f"checkpoint {K}: one chunk trained in many orders (lower is better)", fontsize=9)
        ax.legend(fontsize=7, loc="best")
        fig.tight_layout()
        name = f"k{K:05d}.png"
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        names.append(name)
    return names


def markdown(report: dict[str, Any], plots: list[str]) -> str:
    """results.md: the command, the setup, the verdict table across chunks, per-chunk rows."""
    setup = report["setup"]
    lines = [f"```\n{report['command']}\n```", "",
             "# Census: counterfactual chunks", "",
             f"Run `{setup['run_dir']}` (schedule `{setup['schedule']}`, L = {setup['L']}): checkpoints "
             f"{setup['checkpoints']}, {setup['chunks']} chunk(s) after each, {setup['random_orders']} random orders"
             f"{', all L! orders' if setup.get('all_orders') else ''}{', persist ' + str(setup['persist']) + ' chunks' if setup.get('persist') else ''}. "
             "Metric: mean held-out loss over the run's in-domain eval sets after the branch (nats, lower is better). "
             "z < 0: better than the mean random order; rank 1: better than every random order.", "",
             f"Compute: {report['compute']['branches']} branches, {report['compute']['branch_seconds']:.0f} s of actor time "
             f"({report['compute']['branch_cpu_seconds']:.0f} s CPU), S and D3's orders "
             f"{report['compute']['orders_seconds']:.0f} s.", ""]
    for metric, summary in report["summary"].items():
        title = "after the branched chunk" if metric == "eval" else f"after {setup.get('persist')} more shared chunks"
        lines += [f"## Across chunks ({title})", "",
                  f"{summary['chunks']} chunks; mean sd of the held-out loss over random orders: "
                  f"{_f(summary['mean_random_sd'], 5)} nats (how much order matters here).", "",
                  "| order | mean z | 95% CI | beats median random | chunks |", "|---|---|---|---|---|"]
        for name in MARKED:
            if name in summary:
                s = summary[name]
                lines.append(f"| {name} | {_f(s['mean_z'], 2)} | [{_f(s['ci_low'], 2)}, {_f(s['ci_high'], 2)}] | "
                             f"{s['share_beats_median']:.0%} | {s['n']} |")
        for label, what in (("objective", "D3's objective (ordering_cost on the run estimator's S)"),
                            ("lookahead_objective", "the exact look-ahead's objective")):
            if label in summary:
                s = summary[label]
                lines += ["", f"Correlation over every branch of a chunk between {what} and the held-out loss: "
                              f"mean Pearson {_f(s['mean_pearson'], 2)} (95% CI [{_f(s['ci_low'], 2)}, "
                              f"{_f(s['ci_high'], 2)}], {s['n']} chunks), mean Spearman {_f(s['mean_spearman'], 2)}. "
                              "Positive = orders with a lower objective gave a lower loss."]
        lines.append("")
    control = report.get("control", {}).get("recency")
    if control:
        lines += ["## Positive control: recency", "",
                  "Per chunk the control domain is the one whose count per batch varies most (or `--control-domain`); "
                  "`recency_last` trains the batches with most of it last, `recency_first` first. Metric: that "
                  "domain's held-out loss; z against the random orders. The census must find recency_last < random "
                  "< recency_first, with |z| >= 2.", "",
                  "| order | mean z | 95% CI | chunks with \\|z\\| >= 2 the right way | chunks |", "|---|---|---|---|---|"]
        for order in ("recency_last", "recency_first"):
            if order in control:
                c = control[order]
                lines.append(f"| {order} | {_f(c['mean_z'], 2)} | [{_f(c['ci_low'], 2)}, {_f(c['ci_high'], 2)}] | "
                             f"{c['share_past_2']:.0%} | {c['n']} |")
        lines += ["", f"**Control {'found' if control['found'] else 'NOT found'}**: "
                      + ("the census sees a planted order effect of this kind at this point of the run."
                         if control["found"] else "mean z of recency_last is not <= -2 with its interval below 0: "
                         "a null result of this census cannot be read as 'no order effect'."), "",
                  "| checkpoint/chunk | domain | random mean | random sd | last z (rank) | first z (rank) | d3 z |",
                  "|---|---|---|---|---|---|---|"]
        for key, r in control["chunks"].items():
            def zr(order: str, r: dict[str, Any] = r) -> str:
                return "-" if order not in r else f"{_f(r[order]['z'], 2)} ({r[order]['rank']})"

            lines.append(f"| {key} | {r['domain']} | {_f(r['random_mean'])} | {_f(r['random_sd'], 5)} | "
                         f"{zr('recency_last')} | {zr('recency_first')} | {_f(r.get('d3', {}).get('z'), 2)} |")
        lines.append("")
    planted = report.get("control", {}).get("planted")
    if planted:
        lines += planted_markdown(planted)
    if report["reproduction"]:
        lines += ["## Reproduction check", "",
                  "The run's own order from checkpoint K against the run's checkpoint K + 1 (weights):", ""]
        for r in report["reproduction"]:
            lines.append(f"- from checkpoint {r['from_checkpoint']}, chunk {r['chunk']} (against `{r['against']}`): max |Δθ| = {r['max_abs_diff']:.3g}, "
                         f"{'close' if r['close'] else 'NOT close'} at float32 tolerance (rtol 1.3e-6, atol 1e-5)")
        lines.append("")
    lines += ["## Per chunk", "",
              "| checkpoint/chunk | random mean | random sd | d3 z (rank) | reverse z (rank) | alternate z (rank) | "
              "lookahead z (rank) | objective r | failed |", "|---|---|---|---|---|---|---|---|---|"]
    for key, by_metric in report["chunks"].items():
        s = by_metric["eval"]

        def cell(name: str, s: dict[str, Any] = s) -> str:
            m = s["marked"].get(name)
            return "-" if m is None else f"{_f(m['z'], 2)} ({m['rank']}/{s['random_n'] + 1})"

        lines.append(f"| {key} | {_f(s['random_mean'])} | {_f(s['random_sd'], 5)} | {cell('d3')} | {cell('d3_reverse')} | "
                     f"{cell('d3_alternate')} | {cell('lookahead')} | {_f(s.get('objective', {}).get('pearson'), 2)} | "
                     f"{', '.join(s['failed']) or '-'} |")
    lines.append("")
    lines += [f"![{p}]({p})" for p in plots]
    return "\n".join(lines) + "\n"


def planted_markdown(control: dict[str, Any]) -> list[str]:
    """The "Positive control: planted batch" section of results.md."""
    L, rho, pr, diff = control["L"], control["spearman"], control["pearson"], control["late_minus_early"]
    kinds = sorted({r["kind"] for r in control["chunks"].values()})
    lines = ["## Positive control: planted batch", "",
             f"One batch of each branched chunk is planted ({', '.join(kinds) or '-'}: "
             + ("each sequence's real tokens shuffled within it" if kinds == ["shuffled"] else
                "every real token one id" if kinds == ["repeated"] else "tokens broken")
             + "; lengths, padding and loss masks kept), and every order of the chunk, D3's included, trains the "
             f"planted chunk. Over the random orders, the planted batch's position (1..{L}) against the held-out "
             "loss: Spearman > 0 means the later it comes, the worse (it is better early; the expected answer for a "
             "broken batch, whose harm the clean batches after it partly undo). The census must find a position "
             "effect: the 95% t-interval of the mean Spearman across chunks excludes 0.", "",
             "| across chunks | mean | 95% CI | chunks |", "|---|---|---|---|",
             f"| Spearman(position, loss) | {_f(rho['mean'], 2)} | [{_f(rho['ci_low'], 2)}, {_f(rho['ci_high'], 2)}] | "
             f"{rho['n']} |",
             f"| Pearson(position, loss) | {_f(pr['mean'], 2)} | [{_f(pr['ci_low'], 2)}, {_f(pr['ci_high'], 2)}] | "
             f"{pr['n']} |",
             f"| late − early half, mean loss (nats) | {_f(diff['mean'], 5)} | [{_f(diff['ci_low'], 5)}, "
             f"{_f(diff['ci_high'], 5)}] | {diff['n']} |"]
    for name in ("planted_first", "planted_last"):
        if name in control:
            c = control[name]
            lines.append(f"| {name} z (stream order, planted batch moved {name.split('_')[1]}) | {_f(c['mean_z'], 2)} | "
                         f"[{_f(c['ci_low'], 2)}, {_f(c['ci_high'], 2)}] | {c['n']} |")
    if control["found"]:
        verdict = (f"**Control found**: the census sees the planted batch's position move the held-out loss; "
                   f"it says the batch should go **{control['better']}** "
                   + ("(as expected)." if control["better"] == "early" else "(against the expectation: early)."))
    else:
        verdict = ("**Control NOT found**: the interval of the mean Spearman includes 0 (or there are fewer than "
                   "two chunks): the census does not see where a broken batch should go, so a null result of this "
                   "census cannot be read as 'no order effect'.")
    lines += ["", verdict, ""]
    for name in ("d3", "d3_reverse", "lookahead"):
        if name in control:
            c = control[name]
            found_side = (f"; in the half the census found better ({control['better']}) in {c['found_side']:.0%}"
                          if control["found"] else "")
            lines.append(f"- {name} put the planted batch at mean position {c['mean_position']:.1f} of {L}; in the "
                         f"half that chunk's random orders found better in "
                         + (f"{c['better_side']:.0%} of {c['better_side_n']} chunks" if c["better_side_n"] else "no chunk")
                         + f"{found_side}.")
    lines += ["", "| checkpoint/chunk | planted batch (stream index) | random orders | Spearman | Pearson | early mean | late mean | "
                  "late − early | better | d3 position (half) | d3_reverse position | planted_first z | planted_last z |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, r in control["chunks"].items():
        def pos(name: str, r: dict[str, Any] = r) -> str:
            return "-" if name not in r else f"{r[name]['position']} ({r[name]['side']})"

        def z(name: str, r: dict[str, Any] = r) -> str:
            return "-" if name not in r else _f(r[name]["z"], 2)

        lines.append(f"| {key} | {r['planted_batch']} | {r['n']} | {_f(r['spearman'], 2)} | {_f(r['pearson'], 2)} | "
                     f"{_f(r['early_mean'])} | {_f(r['late_mean'])} | {_f(r['late_minus_early'], 5)} | "
                     f"{r['better'] or '-'} | {pos('d3')} | {pos('d3_reverse')} | {z('planted_first')} | "
                     f"{z('planted_last')} |")
    lines.append("")
    return lines
