"""What the driver writes and prints when a run ends: the schedule's figures from the schedule log
(``final_metrics.json``), where the coordinator and the scheduler's actors ran (``placement.json``), and the
closing table (per-domain perplexities, the schedule, the data-quality counts)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from d3ray.influence.resources import cpu_priority
from d3ray.run_files import read_jsonl

#: The schedule-log fields of D3's predicted loss change (d3ray/solver/loss_change.py), summed over the run.
PREDICTED_FIELDS = ("predicted_loss_change_vs_stream_nats", "predicted_loss_change_vs_random_nats")


def schedule_summary(run_dir: Path) -> dict[str, Any]:
    """The schedule's figures from the schedule log: chunks decided, fallbacks, trainer wait, and (D3)
    what decided the chunks (``decided_by``: the sort of the potential, or which solver searched; how many
    chunks a search ran for) and the chosen orders' predicted first-order loss change against stream order
    and against the mean random order, summed over the decided chunks, in nats (d3ray/solver/loss_change.py:
    from the same S or f that chose them, so they differ between runs, unlike the S cost a sort makes 0)."""
    rows = read_jsonl(run_dir / "schedule_log.jsonl")
    out: dict[str, Any] = {"schedule/chunks": len(rows), "schedule/fallbacks": sum(bool(r["fallback"]) for r in rows),
                           "schedule/trainer_wait_sec": sum(r["trainer_wait_sec"] for r in rows)}
    decided = [r for r in rows if r.get("decided_by")]
    if decided:
        kinds = sorted({r["decided_by"] for r in decided})
        out["schedule/decided_by"] = "; ".join(f"{k} ({sum(r['decided_by'] == k for r in decided)} chunks)" for k in kinds)
        out["schedule/estimator"] = decided[0].get("estimator")
        out["schedule/searched_chunks"] = sum(bool(r.get("search")) for r in decided)
        for name in PREDICTED_FIELDS:
            out[f"schedule/{name}"] = float(sum(r[name] for r in decided if r.get(name) is not None))
        out["schedule/predicted_chunks"] = len(decided)
    skipped = sum(sum(r.get("skipped", {}).values()) for r in rows)
    if skipped:
        out["schedule/skipped_samples"] = skipped
    return out


def write_placement(run_dir: Path, coordinator: Any, scheduler: Any) -> None:
    """``placement.json``: the node id of the coordinator and of every actor the scheduler started,
    by role, and each actor's OS niceness and CPU priority (``schedule.placement.nice`` / ``idle``)."""
    import ray

    def ask(actor: Any, fn: Any) -> Any:
        """``fn()`` evaluated inside the actor's process; a dead actor gives the reason instead."""
        try:
            return ray.get(actor.__ray_call__.remote(lambda self: fn()), timeout=30)
        except Exception as err:
            return f"unavailable: {type(err).__name__}"

    placement: dict[str, Any] = {
        "driver": ray.get_runtime_context().get_node_id(),
        "coordinator": ask(coordinator, lambda: ray.get_runtime_context().get_node_id()),
    }
    for role, actors in scheduler.actors().items():
        placement[role] = [ask(a, lambda: ray.get_runtime_context().get_node_id()) for a in actors]
        placement[f"{role}_nice"] = [ask(a, lambda: os.nice(0)) for a in actors]
        placement[f"{role}_priority"] = [ask(a, cpu_priority) for a in actors]
    (run_dir / "placement.json").write_text(json.dumps(placement, indent=2))


def print_summary(final: dict[str, Any], report: dict[str, Any]) -> None:
    """Per-domain perplexities and the data-quality counts, as a small table."""
    print(f"\nfinished {final.get('steps')} steps, final train loss {final.get('final_loss', float('nan')):.4f}, "
          f"{final.get('tokens_per_sec', 0):.0f} tok/s, wall {final.get('wall_seconds', 0):.1f}s")
    rows = sorted(k for k in final if k.startswith("eval/") and k.endswith("/ppl"))
    if rows:
        print(f"{'eval set':<32} {'loss':>8} {'ppl':>10}")
        for key in rows:
            name = key[len("eval/"):-len("/ppl")]
            print(f"{name:<32} {final[f'eval/{name}/loss']:>8.4f} {final[key]:>10.2f}")
    if final.get("schedule/chunks"):
        line = (f"schedule: {final['schedule/chunks']} chunks decided, {final['schedule/fallbacks']} fallbacks, "
                f"trainer wait {final['schedule/trainer_wait_sec']:.1f}s")
        if "schedule/decided_by" in final:
            line += (f"\nD3: {final['schedule/estimator']}; {final['schedule/decided_by']}, a search in "
                     f"{final['schedule/searched_chunks']} chunks; predicted first-order loss change of the chosen "
                     f"orders (the chunks' own batches, from the S or f that chose them, summed over "
                     f"{final['schedule/predicted_chunks']} chunks): "
                     f"{final['schedule/predicted_loss_change_vs_stream_nats']:+.4g} nats vs stream order, "
                     f"{final['schedule/predicted_loss_change_vs_random_nats']:+.4g} nats vs the mean random order")
        if "schedule/skipped_samples" in final:
            line += f", {final['schedule/skipped_samples']} samples not selected"
        print(line)
    quality = report.get("data_quality") or {}
    if quality:
        print(f"data: {quality.get('total_good', '?')} good records, {quality.get('total_bad', '?')} bad "
              f"({quality.get('bad_by_reason', {})}); dropped tail sequences: {report.get('dropped_tail_sequences', 0)}")
