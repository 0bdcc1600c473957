"""The shared trunk of a comparison: every arm of a seed branches from one warm-up checkpoint.

At the tiny scale the final loss of a run is a chaotic read-out (docs/results/README.md): reshuffling
the batches of each chunk moves it about as much as a new seed, so the arms of one seed are barely
correlated and pairing by seed removes little noise. A trunk makes the arms share everything up to
the branch point, past the loss plateau, so that they differ only in what their schedulers decide
after it (issue #28):

    per seed:  trunk-s<seed>  the trunk arm's config (default: the baseline, random order), the
               │              LR schedule of train.steps, stopped at step N (train.stop_at_step)
               │              → its final checkpoint (weights, AdamW moments, LR position, data cursor)
               ▼ branch_checkpoint(): <arm run_dir>/trunk_checkpoint/ (deepspeed/ linked, not copied;
               │   state.json with the trunk's scheduler state replaced by branch_schedule_state)
    every arm: train.init_checkpoint = that directory → the run resumes at step N with its own,
               fresh scheduler and trains steps N..train.steps; the report reads its evaluations after N

What the arm keeps of the trunk's schedule state: the data cursor (chunk N starts where the trunk's
stream stopped) when the arm reads the same stream (same window, shuffle buffer, no mixture);
otherwise the arm's own stream is re-read up to chunk N. What it drops: the trunk scheduler's
decisions of the next chunks and its state (a random scheduler's, not the arm's); ``branch_at``
tells the coordinator that the fresh scheduler has no feedback of the trunk's chunks to wait for.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from d3ray.config import RunConfig

BRANCH_DIR = "trunk_checkpoint"


def same_stream(trunk: RunConfig, arm: RunConfig) -> bool:
    """Whether the arm's chunk stream is the trunk's (then the trunk's data cursor is valid for it)."""
    a, b = trunk.schedule, arm.schedule
    return (a.L == b.L and a.window_batches() == b.window_batches() and a.shuffle_buffer == b.shuffle_buffer
            and not a.draws_mixture and not b.draws_mixture and trunk.data == arm.data)


def branch_schedule_state(schedule: dict[str, Any], branch_at: int, keep_cursor: bool) -> dict[str, Any]:
    """The schedule state an arm starts from: no decisions and no scheduler state of the trunk's
    scheduler; the trunk's data cursor at chunk ``branch_at`` (or none: the arm re-reads its stream);
    ``branch_at`` (the coordinator expects no feedback of the chunks before it)."""
    out: dict[str, Any] = {"branch_at": branch_at}
    cursor = schedule.get("data_cursor")
    if keep_cursor and cursor is not None and int(cursor["chunk_id"]) == branch_at:
        out["data_cursor"] = cursor
    else:
        out["data_cursor"] = {"chunk_id": branch_at, "cursor": None}
    return out


def trunk_checkpoint(trunk_dir: Path, steps: int) -> Path:
    """The trunk's final checkpoint (step ``steps``).

    Raises:
        ConfigError: the trunk has no checkpoint at that step.
    """
    from d3ray.config_loading import ConfigError

    for c in sorted(trunk_dir.glob("checkpoint_*")):
        state = c / "state.json"
        if state.is_file() and json.loads(state.read_text()).get("step") == steps:
            return c
    raise ConfigError(f"trunk {trunk_dir}: no checkpoint at step {steps} (trunk.steps); delete the trunk to rerun it")


def branch_checkpoint(trunk_dir: Path, steps: int, target: Path, keep_cursor: bool, L: int) -> Path:
    """``target`` (an arm's ``trunk_checkpoint/``): the trunk's checkpoint at ``steps`` with the schedule
    state of a fresh scheduler (:func:`branch_schedule_state`); its ``deepspeed/`` is a link to the
    trunk's (read once at the arm's start). Written once; an existing one is kept."""
    if (target / "state.json").is_file():
        return target
    source = trunk_checkpoint(trunk_dir, steps)
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for item in source.iterdir():
        if item.name == "deepspeed":
            (partial / "deepspeed").symlink_to(item.resolve(), target_is_directory=True)
        elif item.is_dir():
            shutil.copytree(item, partial / item.name)
        else:
            shutil.copy2(item, partial / item.name)
    state = json.loads((partial / "state.json").read_text())
    if state.get("position"):
        raise ValueError(f"trunk {trunk_dir} stopped inside a chunk (step {steps}): trunk.steps must be a "
                         f"multiple of schedule.L={L}")
    state["schedule"] = branch_schedule_state(state.get("schedule") or {}, int(state["next_chunk"]), keep_cursor)
    (partial / "state.json").write_text(json.dumps(state))
    partial.rename(target)
    return target
