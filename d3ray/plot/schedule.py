"""PNG plots of a run's schedule: S heatmaps, the trained order by domain, cost reduction.

Reads only the run directory (``schedule_log.jsonl``, ``samples.jsonl``, ``influence/S_*.npy``),
so it works on a finished run, a running one, or a copy.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import numpy as np

from d3ray.run_files import read_jsonl

logger = logging.getLogger(__name__)


def plot_s_heatmap(run_dir: Path, out: Path, chunk_id: int | None = None) -> Path | None:
    """Heatmap of S for one chunk, rows and columns in the trained order (S[i, j] > 0: i before j)."""
    import matplotlib.pyplot as plt

    files = sorted((run_dir / "influence").glob("S_*.npy"))
    if not files:
        return None
    path = files[0] if chunk_id is None else run_dir / "influence" / f"S_{chunk_id:06d}.npy"
    if not path.exists():
        raise FileNotFoundError(f"no saved S for chunk {chunk_id} in {run_dir / 'influence'}")
    cid = int(path.stem.split("_")[1])
    S = np.load(path)
    orders = {r["chunk_id"]: r["order"] for r in read_jsonl(run_dir / "schedule_log.jsonl")}
    order = orders.get(cid, list(range(len(S))))
    lim = float(np.abs(S).max()) or 1.0
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.4))
    for ax, mat, title in ((axes[0], S, "stream order"), (axes[1], S[np.ix_(order, order)], "trained order")):
        im = ax.imshow(mat, cmap="RdBu_r", vmin=-lim, vmax=lim)
        ax.set_title(f"S, chunk {cid}, {title}")
        ax.set_xlabel("batch j")
        ax.set_ylabel("batch i" if ax is axes[0] else "")
    fig.colorbar(im, ax=axes, label="S[i, j] > 0: train i before j")
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return out


def plot_order_by_domain(run_dir: Path, out: Path) -> Path | None:
    """Grid: x = chunk, y = position in the chunk, colour = the majority domain of the batch trained there."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    rows = read_jsonl(run_dir / "samples.jsonl")
    if not rows or "domains" not in rows[0]:
        return None
    chunks = sorted({r["chunk_id"] for r in rows})
    L = max(r["position"] for r in rows) + 1
    majority = {(r["chunk_id"], r["position"]): Counter(r["domains"]).most_common(1)[0][0] for r in rows}
    names = sorted(set(majority.values()))
    grid = np.full((L, len(chunks)), np.nan)
    step_of = {}
    for r in rows:
        step_of.setdefault(r["chunk_id"], []).append(r)
    for x, cid in enumerate(chunks):
        for y, r in enumerate(sorted(step_of[cid], key=lambda r: r["step"])):
            grid[y, x] = names.index(majority[(cid, r["position"])])
    cmap = ListedColormap(plt.get_cmap("tab10").colors[: len(names)])
    fig, ax = plt.subplots(figsize=(max(6, len(chunks) * 0.25), 4))
    ax.imshow(grid, aspect="auto", cmap=cmap, vmin=-0.5, vmax=len(names) - 0.5, interpolation="nearest")
    ax.set_xlabel("chunk")
    ax.set_ylabel("training position in chunk")
    ax.set_title("trained order, majority domain of each batch")
    handles = [plt.Rectangle((0, 0), 1, 1, color=cmap(i)) for i in range(len(names))]
    ax.legend(handles, names, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return out


def plot_cost_reduction(run_dir: Path, out: Path) -> Path | None:
    """Per chunk: backward weight of S in stream order vs the trained order, and the reduction."""
    import matplotlib.pyplot as plt

    rows = [r for r in read_jsonl(run_dir / "schedule_log.jsonl") if r.get("cost_stream") is not None]
    if not rows:
        return None
    cid = np.array([r["chunk_id"] for r in rows])
    before = np.array([r["cost_stream"] for r in rows])
    after = np.array([r["cost_after"] for r in rows])
    reduction = np.where(before > 0, 1.0 - after / np.where(before > 0, before, 1.0), 0.0)
    fallback = np.array([bool(r.get("fallback")) for r in rows])
    fig, axes = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True)
    axes[0].plot(cid, before, "o-", label="stream order")
    axes[0].plot(cid, after, "o-", label="trained order")
    axes[0].set_ylabel("backward weight of S")
    axes[0].legend()
    axes[1].bar(cid, 100 * reduction, color=np.where(fallback, "tab:red", "tab:green"))
    axes[1].set_ylabel("cost reduction %")
    axes[1].set_xlabel("chunk (red: fallback order)")
    fig.suptitle("D3 ordering objective per chunk")
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return out


def plot_mixture(run_dir: Path, out: Path) -> Path | None:
    """A mixer's domain weights per chunk (stacked), from the ``mixture`` of each schedule-log record."""
    import matplotlib.pyplot as plt

    rows = sorted((r for r in read_jsonl(run_dir / "schedule_log.jsonl") if r.get("mixture")),
                  key=lambda r: r["chunk_id"])
    if not rows:
        return None
    domains = sorted({d for r in rows for d in r["mixture"]})
    cid = np.array([r["chunk_id"] for r in rows])
    weights = np.array([[float(r["mixture"].get(d, 0.0)) for r in rows] for d in domains])
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.stackplot(cid, weights, labels=domains, step="post")
    ax.set_xlim(cid[0], cid[-1] if len(cid) > 1 else cid[0] + 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("chunk")
    ax.set_ylabel("mixture weight")
    ax.set_title(f"domain mixture per chunk ({rows[0].get('scheduler', 'mixer')})")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return out


def plot_schedule(run_dir: str | Path, out_dir: str | Path | None = None, chunk_id: int | None = None) -> list[Path]:
    """All schedule plots of ``run_dir`` into ``out_dir`` (default ``<run_dir>/plots``); paths written."""
    import matplotlib

    matplotlib.use("Agg")
    run_dir = Path(run_dir)
    if not (run_dir / "schedule_log.jsonl").exists():
        raise FileNotFoundError(f"{run_dir} has no schedule_log.jsonl (is it a d3ray run directory?)")
    out_dir = Path(out_dir) if out_dir else run_dir / "plots"
    out_dir.mkdir(parents=True, exist_ok=True)
    made = [
        plot_s_heatmap(run_dir, out_dir / "s_heatmap.png", chunk_id),
        plot_order_by_domain(run_dir, out_dir / "order_by_domain.png"),
        plot_cost_reduction(run_dir, out_dir / "cost_reduction.png"),
        plot_mixture(run_dir, out_dir / "mixture.png"),
    ]
    return [p for p in made if p is not None]
