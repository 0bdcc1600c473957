"""results.md of the comparison report: the verdict sentences, the tables, the notes on reading it.

What was run (and what failed, with its error), one plain sentence per arm on the primary metric at equal
tokens and at equal compute (with its power line: the seeds a paired t-test needs), the full tables of the
primary metric, compact tables of every other eval metric, compute per arm, the unigram entropy of the
validation text, and the plots. ``report.py`` computes what this renders.
"""

from __future__ import annotations

import math
from pathlib import Path

from d3ray.lab.compare.plan import EQUAL_TOKEN_KEYS, ComparePlan
from d3ray.lab.compare.readout import PAPER_EFFECT_NATS, seeds_for_power
from d3ray.lab.compare.stats import BETTER, FEW, TIE, WORSE, PairedComparison, lower_is_better
from d3ray.lab.compare.table import EQUAL_COMPUTE, ArmResult, RunRecord
from d3ray.run_files import display_path

PHRASES = {BETTER: "beat {base} beyond seed noise", WORSE: "was worse than {base} beyond seed noise",
           TIE: "did not differ from {base} beyond seed noise", FEW: "cannot be judged against {base} (fewer than 2 paired seeds)"}


def _fmt(x: float | None, digits: int = 4) -> str:
    if x is None or not math.isfinite(x):
        return "n/a"
    return f"{x:.{digits}g}" if abs(x) >= 1e4 else f"{x:.{digits}f}"


def _pct(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{100 * x:+.2f}%"


def _p(p: float) -> str:
    return "n/a" if not math.isfinite(p) else ("< 0.001" if p < 0.001 else f"{p:.3f}")


def _p_holm(c: PairedComparison) -> str:
    """The p-value, and its Holm adjustment when the metric had several comparisons."""
    return _p(c.p_value) + (f", Holm {_p(c.p_holm)} over {c.family}" if c.family > 1 else "")


def power_line(c: PairedComparison, metric: str, confidence: float = 0.95, power: float = 0.8) -> str:
    """The paired sd, and the seeds a paired t-test needs for ``power`` at level 1 − ``confidence``:
    for the observed Δ and (a loss) for the D3 paper's −4.2% perplexity (``readout.py``)."""
    if not math.isfinite(c.std_diff):
        return ""
    alpha, pct = 1.0 - confidence, int(round(100 * power))

    def seeds(effect: float) -> str:
        n = seeds_for_power(effect, c.std_diff, power, alpha)
        return f"{n:.0f}" if math.isfinite(n) else "∞"

    line = f"paired sd {_fmt(c.std_diff)}; {pct}% power needs {seeds(c.mean_diff)} seeds for this Δ"
    if metric.split("@")[0].endswith("loss"):
        line += f", {seeds(PAPER_EFFECT_NATS)} for the paper's −4.2% perplexity (Δ {_fmt(PAPER_EFFECT_NATS)} nats)"
    return line


def sentence(result: ArmResult, base: str, base_mean: float, confidence: float = 0.95, power: float = 0.8) -> str:
    """One plain sentence: the arm against ``base`` on the result's metric, and its power line."""
    c = result.vs_baseline
    assert c is not None
    better_word = "lower" if lower_is_better(result.metric) else "higher"
    ppl = ""
    if result.metric.split("@")[0].endswith("loss") and math.isfinite(c.mean_diff):
        ppl = f" (perplexity {_pct(math.exp(c.mean_diff) - 1)})"  # e^loss: the paper's relative perplexity
    detail = (f"{result.summary.format()} vs {_fmt(base_mean)}: {_pct(c.rel_change)}{ppl}, paired Δ {_fmt(c.mean_diff)} "
              f"({int(100 * confidence)}% CI [{_fmt(c.ci_low)}, {_fmt(c.ci_high)}], p {_p_holm(c)}, "
              f"{better_word} in {c.wins}/{c.n} seeds")
    if math.isfinite(result.eval_se):
        detail += f"; eval SE {_fmt(result.eval_se)}"
    powered = power_line(c, result.metric, confidence, power)
    return f"{detail}) — it **{PHRASES[c.verdict].format(base=base)}**" + (f". Power: {powered}" if powered else "")


def results_markdown(plan: ComparePlan, records: list[RunRecord], results: dict[str, list[ArmResult]],
                     entropy: dict[str, float], plots: list[Path], command: str, primary: str) -> str:
    """The whole of results.md; ``primary`` is the metric the verdicts use (``report.primary_metric``)."""
    cfg = plan.compare
    base = cfg.baseline
    final_metric = cfg.metric
    power = cfg.report.power
    lines = [f"# Comparison: {cfg.name}", ""]
    if command:
        lines += ["Made by:", "", "```bash", command, "```", ""]
    t = plan.base.train
    seq = plan.base.sft.seq_len if plan.base.sft is not None else plan.base.data.seq_len
    lines += [f"Mode **{cfg.mode}**, {len(plan.arms)} arms × {len(cfg.seeds)} seeds ({', '.join(map(str, cfg.seeds))}), "
              f"every run {t.steps} steps × {t.global_batch_size} sequences × {seq} tokens "
              f"= {t.steps * t.global_batch_size * seq:,} training tokens (equal for every arm: "
              f"{', '.join(EQUAL_TOKEN_KEYS)}). Baseline arm: **{base}**; paired by seed, "
              f"{int(100 * cfg.confidence)}% Student-t intervals of the per-seed difference, two-sided paired t-test "
              "(`d3ray/lab/compare/stats.py`); with several arms, Holm-adjusted p-values over the arms, and a "
              "better / worse verdict only where the adjusted p stays within the level. Methods (D3 arms) vs baselines: "
              + ", ".join(f"{a} ({'method' if plan.methods[a] else 'baseline'}{_label(plan, a)})" for a in plan.arms)
              + ".", ""]
    tokens = sorted({int(r.metrics["tokens"]) for r in records if "tokens" in r.metrics})
    if tokens:
        lines += [f"Tokens the finished runs trained (their `tokens`): {tokens[0]:,}"
                  + (f" to {tokens[-1]:,} (SFT rows are padded: the budget counts padding)" if len(tokens) > 1 else "")
                  + ".", ""]
    lines += _trunk_section(plan)
    lines += _runs_section(records)
    if primary in results:
        lines += ["## Verdicts", ""]
        lines += _order_noise(cfg.aa_arm, base, results, primary, final_metric)
        readings = [("equal tokens", primary)]
        if final_metric != primary:
            readings.append(("equal tokens, final evaluation", final_metric))
        readings.append(("equal compute", final_metric + EQUAL_COMPUTE))
        for label, metric in readings:
            for r in results.get(metric, []):
                if r.vs_baseline is None:
                    continue
                base_mean = next(x.summary.mean for x in results[metric] if x.arm == base)
                if r.summary.n == 0:
                    finished = any(x.arm == r.arm and x.summary.n for x in results[primary])
                    why = ("its first evaluation comes after the baseline's whole compute (lower train.eval_every)"
                           if finished else "no finished run")
                    lines.append(f"- **{r.arm}** at {label}: no value ({why}).")
                    continue
                shown = metric.removesuffix(EQUAL_COMPUTE)
                lines.append(f"- **{r.arm}** at {label}, `{shown}` {sentence(r, base, base_mean, cfg.confidence, power)}.")
                if r.vs_best_baseline is not None and r.best_baseline is not None:
                    best_mean = next(x.summary.mean for x in results[metric] if x.arm == r.best_baseline)
                    vs_best = ArmResult(metric, r.arm, r.method, r.summary, r.eval_se, r.vs_best_baseline)
                    lines.append(f"  Against the best baseline **{r.best_baseline}**: "
                                 f"{sentence(vs_best, r.best_baseline, best_mean, cfg.confidence, power)}.")
                if r.vs_control is not None and r.control is not None:
                    control_mean = next((x.summary.mean for x in results[metric] if x.arm == r.control), float("nan"))
                    vs_control = ArmResult(metric, r.arm, r.method, r.summary, r.eval_se, r.vs_control)
                    lines.append(f"  Against its control **{r.control}**{_label(plan, r.control)} — "
                                 f"{sentence(vs_control, r.control, control_mean, cfg.confidence, power)}.")
        lines.append("")
    if entropy:
        final = next((x.summary.mean for x in results.get(final_metric, []) if x.arm == base), float("nan"))
        cross, floor = entropy.get("cross_entropy/mean", float("nan")), entropy.get("entropy/mean", float("nan"))
        lines += ["## Unigram baselines of the validation text", "",
                  "Under the runs' tokenizer, on the evaluated sequences, nats per token averaged over domains "
                  "like `eval/mean_loss` (`d3ray/lab/compare/unigram.py`): unigram cross-entropy (a unigram model "
                  f"fitted on the training text) **{_fmt(cross)}**; entropy of the validation tokens' own "
                  f"frequencies per domain (a floor no unigram model reaches) {_fmt(floor)}, pooled "
                  f"{_fmt(entropy.get('entropy/pooled'))}. The baseline's final `{final_metric}` is **{_fmt(final)}**: "
                  f"{_fmt(cross - final)} nats below the unigram cross-entropy, {_fmt(floor - final)} below the floor.",
                  ""]
    for metric in dict.fromkeys((primary, final_metric, final_metric + EQUAL_COMPUTE)):
        if metric in results:
            lines += _full_table(metric, results[metric], base, records)
    lines += _compute_table(records, plan.arms, base)
    rest = [m for m in results if m not in (primary, final_metric, final_metric + EQUAL_COMPUTE, "compute/total_sec")
            and not m.endswith("/ppl")]
    if rest:
        lines += ["## Every evaluation metric", "",
                  f"mean ± std over seeds; relative change vs {base}, paired p, verdict "
                  "(better / worse / ≈ no difference beyond seed noise); ★ best baseline.", ""]
        lines += ["| metric | " + " | ".join(plan.arms) + " |", "|---|" + "---|" * len(plan.arms)]
        for m in rest:
            lines.append(f"| `{m}` | " + " | ".join(_compact(r) for r in results[m]) + " |")
        lines.append("")
    if plots:
        lines += ["## Plots", ""] + [f"![{p.stem}]({p.relative_to(plan.report_dir).as_posix()})" for p in plots] + [""]
    lines += ["## Reading this report", "",
              "- Equal tokens: every arm trains the same steps × batch × sequence length; a selector reads a "
              "larger candidate window and trains the same number of tokens.",
              "- Equal compute: the budget of each seed is the baseline's total compute (trainer and scheduler-"
              "actor process-seconds, `d3ray/lab/compare/compute.py`); each arm's metric is read off its eval curve "
              "(linear between evaluations) where its cumulative compute reaches it. An arm cheaper than the "
              "baseline reports its final value (it could have trained further). On a shared-core box the "
              "seconds of actors and trainers overlap: compute figures are upper bounds there.",
              "- eval SE is the evaluation's own standard error (sequences as the sampling unit; binomial for exact "
              "match), averaged over seeds. The paired comparison uses the same eval set for both arms of a seed, "
              "so seed-to-seed spread, not eval SE, is the noise the verdict is judged against.", ""]
    return "\n".join(lines)


def _label(plan: ComparePlan, arm: str) -> str:
    label = next((a.label for a in plan.compare.arms if a.name == arm), "")
    return f": {label}" if label else ""


def _trunk_section(plan: ComparePlan) -> list[str]:
    if not plan.trunks:
        return []
    t = plan.compare.trunk
    arm = t.arm or plan.compare.baseline
    return ["## Shared trunk", "",
            f"Every arm of a seed branches from one checkpoint at step **{t.steps}** of `{arm}`'s config "
            f"(`trunk-s<seed>` in `{display_path(plan.output_dir / 'trunks')}`; the LR schedule is that of the full run): "
            f"weights, optimizer state, LR position and data cursor are shared, and each arm's scheduler starts "
            f"fresh there (`d3ray/lab/compare/trunk.py`). Read-outs over several evaluations use those after step "
            f"{t.steps}; every value in this report is from the arms' own steps {t.steps + 1}..{plan.base.train.steps}.",
            ""]


def _order_noise(aa: str | None, base: str, results: dict[str, list[ArmResult]], primary: str,
                 final: str) -> list[str]:
    """The A/A line: the paired sd of (the baseline with another order seed) − (the baseline)."""
    if aa is None:
        return []
    parts = []
    for metric in dict.fromkeys((primary, final)):
        c = next((r.vs_baseline for r in results.get(metric, []) if r.arm == aa), None)
        if c is not None and math.isfinite(c.std_diff):
            parts.append(f"{_fmt(c.std_diff)} on `{metric}` (mean Δ {_fmt(c.mean_diff)}, {c.n} seeds)")
    if not parts:
        return [f"- **Order noise** (A/A: `{aa}` − `{base}`): not measured (fewer than 2 paired seeds).", ""]
    return [f"- **Order noise** (A/A: `{aa}` − `{base}`, the same seeds, only the order seed differs): paired sd "
            + "; ".join(parts) + ". An arm whose Δ is within a few of these of 0 differs from "
            f"`{base}` by no more than another random order does.", ""]


def _runs_section(records: list[RunRecord]) -> list[str]:
    failed = [r for r in records if r.status == "failed"]
    counts = {s: sum(r.status == s for r in records) for s in ("done", "skipped", "failed")}
    lines = ["## Runs", "", f"{len(records)} runs: {counts['done']} ran now, {counts['skipped']} finished before "
             f"(skipped), {counts['failed']} failed. Run directories: `{display_path(records[0].run_dir.parent)}` "
             "(per run: metrics.jsonl, schedule_log.jsonl, final_metrics.json, compare_status.json)." if records else "",
             ""]
    if failed:
        lines += ["| run | error |", "|---|---|"]
        lines += [f"| {r.run_dir.name} | {(r.error or '').replace('|', '/')} |" for r in failed]
        lines.append("")
    return lines


def _full_table(metric: str, rows: list[ArmResult], base: str, records: list[RunRecord]) -> list[str]:
    title = "at equal compute" if metric.endswith(EQUAL_COMPUTE) else "at equal tokens (final evaluation)"
    if "@last" in metric:
        title = f"at equal tokens (mean of the last {metric.rsplit('@last', 1)[1]} evaluations)"
    elif metric.endswith("@auc"):
        title = "at equal tokens (area under the eval curve over its step span)"
    lines = [f"## `{metric.removesuffix(EQUAL_COMPUTE)}` {title}", "",
             f"| arm | kind | n | mean ± std | eval SE | Δ vs {base} | rel. | CI of Δ | p | wins | verdict |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        kind = ("method" if r.method else "baseline") + (" ★" if r.arm == r.best_baseline else "")
        c = r.vs_baseline
        if c is None:
            cells = ["(baseline)", "", "", "", "", ""]
        else:
            cells = [_fmt(c.mean_diff), _pct(c.rel_change), f"[{_fmt(c.ci_low)}, {_fmt(c.ci_high)}]", _p_holm(c),
                     f"{c.wins}/{c.n}", c.verdict]
        lines.append(f"| {r.arm} | {kind} | {r.summary.n} | {r.summary.format()} | {_fmt(r.eval_se)} | "
                     + " | ".join(cells) + " |")
    if metric.endswith(EQUAL_COMPUTE):
        within = sorted({r.run_dir.name for r in records if r.equal_compute_within_budget})
        lines += ["", "★ best baseline. Runs whose whole compute fit the baseline's budget (final value used): "
                  + (", ".join(within) or "none") + "."]
    else:
        lines += ["", "★ best baseline (lowest mean among the baselines; highest for accuracies)."]
    return lines + [""]


def _compact(r: ArmResult) -> str:
    text = r.summary.format()
    c = r.vs_baseline
    if c is not None and c.n:
        mark = {BETTER: "better", WORSE: "worse", TIE: "≈", FEW: "?"}[c.verdict]
        text += f" ({_pct(c.rel_change)}, p {_p_holm(c)}, {mark})"
    return text + (" ★" if r.arm == r.best_baseline else "")


def _compute_table(records: list[RunRecord], arms: list[str], base: str) -> list[str]:
    parts = ("trainer_step_sec", "trainer_wait_sec", "influence_sec", "solver_sec", "scoring_sec", "total_sec")
    means: dict[str, dict[str, float]] = {}
    for arm in arms:
        runs = [r.compute.as_metrics() for r in records if r.arm == arm and r.compute is not None]
        if runs:
            means[arm] = {p: sum(m[f"compute/{p}"] for m in runs) / len(runs) for p in parts}
    if not means:
        return []
    lines = ["## Compute per run (process-seconds, mean over seeds)", "",
             "| arm | trainer steps | trainer wait | influence | solver | scoring | total | × " + base + " |",
             "|---|---|---|---|---|---|---|---|"]
    ref = means.get(base, {}).get("total_sec", float("nan"))
    for arm, m in means.items():
        ratio = m["total_sec"] / ref if ref and math.isfinite(ref) else float("nan")
        lines.append(f"| {arm} | " + " | ".join(f"{m[p]:.1f}" for p in parts) + f" | {_fmt(ratio, 2)} |")
    return lines + ["", "Trainer parts × train.num_workers; influence × influence_actors; scoring: the scoring "
                    "actor's own busy seconds (`scoring_log.jsonl`). See `d3ray/lab/compare/compute.py`.", ""]
