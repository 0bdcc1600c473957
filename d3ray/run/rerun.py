"""A run directory that already holds a run: the same config resumes it, a finished one is reported as it
is, and another config is refused before anything in it is written.

Ray Train resumes a run name from its newest checkpoint whatever the new config says. Without this check
``d3ray pretrain --schedule.type=odm`` after the default run wrote the ODM config over the D3 run's
``config.yaml``, resumed the D3 run at its last step, trained nothing, and replaced its
``final_metrics.json`` by a NaN loss at 0 tokens/s. Now:

    no run trained there (no checkpoint, no step logged)        → the run starts (nothing to protect)
    a run trained with another config                           → refused in one line naming the keys
    the same config, stopped before its last step               → Ray Train resumes it
    the same config, finished (final_metrics.json at its steps) → its final metrics, nothing trained

Keys that say how a run is carried out, not what it trains, may change on resume (``RESUMABLE_KEYS``):
the cluster (``ray.*``), the retries (``train.max_failures``), where a run stops early
(``train.stop_at_step``: a stopped trunk goes on to its end) and the folder the run directory lies in
(``output_dir``: a moved ``runs/``). A key the stored config lacks (written by an older d3ray) is read as
its default. ``d3ray compare`` reuses a finished run by the same comparison (``stored_config_changes``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from d3ray.errors import UserError
from d3ray.run_files import FINAL_METRICS, display_path, has_trained

RESUMABLE_KEYS = ("ray", "train.max_failures", "train.stop_at_step", "output_dir")
SHOWN_CHANGES = 4


def flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config dict as ``{"schedule.L": 8, ...}`` (lists and tuples are lists)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = list(value) if isinstance(value, tuple) else value
    return out


def stored_config_changes(saved: dict[str, Any], planned: Any,
                          ignored: tuple[str, ...] = ()) -> tuple[list[tuple[str, Any, Any]], list[str]]:
    """How a run directory's ``config.yaml`` (``saved``, as loaded) differs from ``planned`` (a config
    dataclass): (changes, predating).

    ``changes``: (key, saved value, planned value) per differing key, the outermost first and at each depth
    a changed ``type`` first (it explains the keys under it); a key or section named in ``ignored`` is not
    compared. ``predating``: the keys the saved config does not have at all (written before they existed,
    or under another ``type``): they are read as today's defaults (a key since removed or renamed is a
    change, the raw file names it).
    """
    from d3ray.config_loading import ConfigError, from_dict, to_dict

    now = flat(to_dict(planned))
    predating = sorted(now.keys() - flat(saved).keys())
    if predating:
        try:
            saved = to_dict(from_dict(type(planned), saved))
        except ConfigError:
            pass
    old = flat(saved)
    keys = sorted(old.keys() | now.keys(), key=lambda key: (key.count("."), not key.endswith(".type"), key))
    changes = [(key, old.get(key), now.get(key)) for key in keys
               if old.get(key) != now.get(key) and not any(key == i or key.startswith(i + ".") for i in ignored)]
    return changes, predating


def check_rerun(run_dir: Path, planned: Any, target_step: int) -> dict[str, Any] | None:
    """What ``run_pretrain`` does with a run directory that may hold a run (module docstring).

    ``planned`` is the new run's RunConfig, ``target_step`` the step it ends at. Returns the stored final
    metrics when the same run is finished there, else None (start or resume).

    Raises:
        UserError: the directory holds a run trained with another config.
    """
    stored_path = run_dir / "config.yaml"
    if not stored_path.is_file() or not has_trained(run_dir):
        return None
    changes, _ = stored_config_changes(yaml.safe_load(stored_path.read_text()) or {}, planned, RESUMABLE_KEYS)
    if changes:
        shown = ", ".join(f"{key}: {old!r} → {new!r}" for key, old, new in changes[:SHOWN_CHANGES])
        more = f", and {len(changes) - SHOWN_CHANGES} more" if len(changes) > SHOWN_CHANGES else ""
        raise UserError(
            f"{display_path(run_dir)} holds a run trained with another config ({shown}{more}): resume it with its "
            f"own config ({display_path(stored_path)}), or start a new run with --name=NEW or another --output_dir")
    final_path = run_dir / FINAL_METRICS
    if final_path.is_file():
        final = json.loads(final_path.read_text())
        if final.get("steps", 0) >= target_step:
            return final
    return None
