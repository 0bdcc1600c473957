"""The report's PNGs (matplotlib, Agg): curves, per-domain perplexity, SFT exact match, D3 schedules.

    loss_curves.png        validation loss (primary metric) and smoothed training loss per step,
                           per arm: mean over seeds and a band (min to max)
    loss_vs_compute.png    the primary metric against cumulative compute, every run (equal compute)
    domain_ppl.png         final perplexity per domain, bars per arm (mean, error bar = std over seeds)
    sft_by_skill.png       exact match per skill, bars per arm              (when the runs have it)
    sft_by_difficulty.png  exact match per difficulty, one panel per skill  (when the runs have it)
    d3/<arm>/*.png         for D3 arms (the first seed's run): S heatmap, trained order by domain,
                           cost reduction per chunk (``d3ray.plot.schedule``)

Reads only the run directories and the table (``table.RunRecord``); a figure without data is skipped.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from d3ray.lab.compare.compute import compute_curve, eval_curve
from d3ray.lab.compare.plan import ComparePlan
from d3ray.lab.compare.table import RunRecord
from d3ray.lab.schedule_questions import influence_actor_count
from d3ray.run_files import read_jsonl

SFT_KEY = re.compile(r"^eval/(sft:[^:/]+):([^:/]+)(?::d(\d+))?/exact_match$")


def write_plots(plan: ComparePlan, records: list[RunRecord], values: dict[str, dict[str, dict[int, float]]],
                out: Path) -> list[Path]:
    """Every plot that has data, into ``out``; the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    ok = [r for r in records if r.compute is not None]
    made = [
        plot_loss_curves(plan, ok, out / "loss_curves.png"),
        plot_loss_vs_compute(plan, ok, out / "loss_vs_compute.png"),
        plot_domain_ppl(plan.arms, values, out / "domain_ppl.png"),
        plot_sft_by_skill(plan.arms, values, out / "sft_by_skill.png"),
        plot_sft_by_difficulty(plan.arms, values, out / "sft_by_difficulty.png"),
    ]
    made += plot_d3_schedules(plan, ok, out / "d3")
    made = [p for p in made if p is not None]
    remove_stale_plots(out, made)
    return made


PLOT_NAMES = ("loss_curves.png", "loss_vs_compute.png", "domain_ppl.png", "sft_by_skill.png", "sft_by_difficulty.png")


def remove_stale_plots(out: Path, made: list[Path]) -> None:
    """Remove the plots an earlier report left in ``out`` that this one did not make (the schedules of an
    arm no longer in the grid, a figure that has no data now): the report shows this grid only. Only
    the files this module writes are candidates (``PLOT_NAMES`` and everything under ``d3/``)."""
    keep = {p.resolve() for p in made}
    d3 = out / "d3"
    candidates = [out / name for name in PLOT_NAMES] + (sorted(d3.rglob("*")) if d3.is_dir() else [])
    for path in candidates:
        if path.is_file() and path.resolve() not in keep:
            path.unlink()
    if d3.is_dir():
        for folder in sorted((p for p in d3.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            if not any(folder.iterdir()):
                folder.rmdir()
        if not any(d3.iterdir()):
            d3.rmdir()


def _colors(arms: list[str]) -> dict[str, tuple]:
    import matplotlib.pyplot as plt

    cmap = plt.get_cmap("tab10" if len(arms) <= 10 else "tab20")
    return {arm: cmap(i % cmap.N) for i, arm in enumerate(arms)}


def _band(curves: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(steps, mean, min, max) over seeds on the steps every curve has."""
    common = set(curves[0][0].tolist())
    for steps, _ in curves[1:]:
        common &= set(steps.tolist())
    x = np.asarray(sorted(common), dtype=np.int64)
    ys = np.stack([np.interp(x, s, v) for s, v in curves]) if len(x) else np.zeros((len(curves), 0))
    return x, ys.mean(0), ys.min(0), ys.max(0)


def _train_curve(run_dir: Path, window: int = 20) -> tuple[np.ndarray, np.ndarray]:
    rows = sorted((r for r in read_jsonl(run_dir / "metrics.jsonl") if r.get("train/loss") is not None),
                  key=lambda r: r["step"])
    if not rows:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    steps = np.asarray([r["step"] for r in rows], dtype=np.int64)
    loss = np.asarray([r["train/loss"] for r in rows], dtype=np.float64)
    w = max(1, min(window, len(loss)))
    smooth = np.convolve(loss, np.ones(w) / w, mode="valid")  # trailing mean over w steps
    return steps[w - 1:], smooth


def plot_loss_curves(plan: ComparePlan, records: list[RunRecord], out: Path) -> Path | None:
    import matplotlib.pyplot as plt

    metric = plan.compare.metric
    colors = _colors(plan.arms)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    drawn = False
    for arm in plan.arms:
        runs = [r for r in records if r.arm == arm]
        for ax, curves in ((axes[0], [eval_curve(r.run_dir, metric) for r in runs]),
                           (axes[1], [_train_curve(r.run_dir) for r in runs])):
            curves = [c for c in curves if len(c[0])]
            if not curves:
                continue
            x, mean, lo, hi = _band(curves)
            ax.plot(x, mean, "o-" if ax is axes[0] else "-", color=colors[arm], label=f"{arm} (n={len(curves)})",
                    markersize=3)
            ax.fill_between(x, lo, hi, color=colors[arm], alpha=0.2)
            drawn = True
    if not drawn:
        plt.close(fig)
        return None
    axes[0].set_title(f"{metric} (mean over seeds, band min–max)")
    axes[1].set_title("train/loss (20-step trailing mean)")
    for ax in axes:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return out


def plot_loss_vs_compute(plan: ComparePlan, records: list[RunRecord], out: Path) -> Path | None:
    import matplotlib.pyplot as plt

    metric = plan.compare.metric
    configs = {s.name: s.config for s in plan.runs}
    colors = _colors(plan.arms)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    labelled: set[str] = set()
    for r in records:
        cfg = configs[r.run_dir.name]
        steps, vals = eval_curve(r.run_dir, metric)
        c_steps, spent = compute_curve(r.run_dir, cfg.train.num_workers, influence_actor_count(cfg.schedule))
        if not len(steps) or not len(c_steps):
            continue
        ax.plot(np.interp(steps, c_steps, spent), vals, "o-", color=colors[r.arm], markersize=3, alpha=0.8,
                label=None if r.arm in labelled else r.arm)
        labelled.add(r.arm)
    if not labelled:
        plt.close(fig)
        return None
    ax.set_xlabel("cumulative compute (process-seconds: trainers + scheduler actors)")
    ax.set_ylabel(metric)
    ax.set_title("equal compute: every run")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return out


def _grouped_bars(arms: list[str], groups: list[str], data: dict[str, dict[str, list[float]]], out: Path,
                  ylabel: str, title: str, log: bool = False) -> Path:
    import matplotlib.pyplot as plt

    colors = _colors(arms)
    width = 0.8 / max(1, len(arms))
    fig, ax = plt.subplots(figsize=(min(16.0, max(7.0, 0.2 * len(groups) * len(arms) + 3)), 4.5))
    x = np.arange(len(groups))
    for i, arm in enumerate(arms):
        vals = [data.get(arm, {}).get(g, []) for g in groups]
        means = [np.mean(v) if v else np.nan for v in vals]
        stds = [np.std(v, ddof=1) if len(v) > 1 else 0.0 for v in vals]
        ax.bar(x + (i - (len(arms) - 1) / 2) * width, means, width, yerr=stds, color=colors[arm], label=arm,
               capsize=2)
    ax.set_xticks(x, groups, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return out


def plot_domain_ppl(arms: list[str], values: dict[str, dict[str, dict[int, float]]], out: Path) -> Path | None:
    keys = sorted(k for k in values if k.startswith("eval/") and k.endswith("/ppl") and not k.startswith("eval/ood:"))
    if not keys:
        return None
    groups = [k[len("eval/"):-len("/ppl")] for k in keys]
    data = {arm: {g: list(values[k].get(arm, {}).values()) for g, k in zip(groups, keys, strict=True)} for arm in arms}
    return _grouped_bars(arms, groups, data, out, "perplexity (final eval)", "per-domain perplexity, mean ± std over seeds",
                         log=True)


def _sft_keys(values: dict[str, dict[str, dict[int, float]]]) -> list[tuple[str, str, int | None, str]]:
    """(task, skill, difficulty or None, key) of the per-skill / per-difficulty exact-match metrics."""
    out = []
    for key in values:
        m = SFT_KEY.match(key)
        if m:
            out.append((m.group(1), m.group(2), None if m.group(3) is None else int(m.group(3)), key))
    return sorted(out, key=lambda t: (t[0], t[1], -1 if t[2] is None else t[2]))


def plot_sft_by_skill(arms: list[str], values: dict[str, dict[str, dict[int, float]]], out: Path) -> Path | None:
    rows = [(skill, key) for _, skill, d, key in _sft_keys(values) if d is None]
    if not rows:
        return None
    groups = [skill for skill, _ in rows]
    data = {arm: {skill: list(values[key].get(arm, {}).values()) for skill, key in rows} for arm in arms}
    return _grouped_bars(arms, groups, data, out, "exact match", "SFT exact match by skill, mean ± std over seeds")


def plot_sft_by_difficulty(arms: list[str], values: dict[str, dict[str, dict[int, float]]], out: Path) -> Path | None:
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    by_skill: dict[str, list[tuple[int, str]]] = {}
    for _, skill, d, key in _sft_keys(values):
        if d is not None:
            by_skill.setdefault(skill, []).append((d, key))
    if not by_skill:
        return None
    colors = _colors(arms)
    n = len(by_skill)
    cols = min(4, n)
    fig, axes = plt.subplots((n + cols - 1) // cols, cols, figsize=(3.6 * cols, 3.2 * ((n + cols - 1) // cols)),
                             squeeze=False, layout="constrained")
    for ax, (skill, levels) in zip(axes.ravel(), sorted(by_skill.items()), strict=False):
        for arm in arms:
            xs, ms, ss = [], [], []
            for d, key in levels:
                v = list(values[key].get(arm, {}).values())
                if v:
                    xs.append(d)
                    ms.append(np.mean(v))
                    ss.append(np.std(v, ddof=1) if len(v) > 1 else 0.0)
            if xs:
                ax.errorbar(xs, ms, yerr=ss, marker="o", color=colors[arm], label=arm, capsize=2, markersize=3)
        ax.set_title(skill, fontsize=9)
        ax.set_xlabel("difficulty")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylim(-0.05, 1.05)
        ax.grid(alpha=0.3)
    for ax in axes.ravel()[n:]:
        ax.axis("off")
    axes.ravel()[0].set_ylabel("exact match")
    axes.ravel()[0].legend(fontsize=7)
    fig.suptitle("SFT exact match by skill and difficulty (mean ± std over seeds)")
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return out


def plot_d3_schedules(plan: ComparePlan, records: list[RunRecord], out: Path) -> list[Path]:
    """The schedule plots of the first finished seed of every arm that saved S matrices (D3)."""
    from d3ray.plot.schedule import plot_schedule

    made: list[Path] = []
    for arm in plan.arms:
        runs = sorted((r for r in records if r.arm == arm), key=lambda r: r.seed)
        run = next((r for r in runs if any((r.run_dir / "influence").glob("S_*.npy"))), None)
        if run is not None:
            made += plot_schedule(run.run_dir, out / arm)
    return made
