"""The ``latest`` pointer of a run: ``<storage_path>/<name>/latest`` holds the name of its newest
checkpoint that is wholly in storage.

Ray Train names checkpoints ``checkpoint_<timestamp>`` and deletes old ones (``train.keep_checkpoints``);
with the asynchronous upload a newer directory may still be half copied. The pointer is written by the
Ray Train controller after a report's checkpoint is persisted (``UserCallback.after_report``), through
the checkpoint's own pyarrow filesystem (local, NFS, ``s3://``, ``gs://``), written to a temporary name
and moved over the old pointer, so a reader sees the old name or the new one, never a half-written one.
``d3ray export``, ``eval`` and ``--from`` follow it from a run directory.
"""

from __future__ import annotations

import posixpath
from pathlib import Path
from typing import Any

LATEST = "latest"


def write_latest(filesystem: Any, checkpoint_path: str) -> None:
    """Point ``<parent of checkpoint_path>/latest`` at ``checkpoint_path`` (a ``pyarrow.fs`` path)."""
    parent, name = posixpath.split(checkpoint_path.rstrip("/"))
    staging = posixpath.join(parent, f".{LATEST}.tmp")
    with filesystem.open_output_stream(staging) as out:
        out.write(f"{name}\n".encode())
    filesystem.move(staging, posixpath.join(parent, LATEST))


def read_latest(run_dir: str | Path) -> Path | None:
    """The checkpoint directory ``run_dir/latest`` names, or None when there is no pointer or it names
    a directory that is gone (a run directory copied without its old checkpoints)."""
    pointer = Path(run_dir) / LATEST
    if not pointer.is_file():
        return None
    target = Path(run_dir) / pointer.read_text().strip()
    return target if target.is_dir() else None


def latest_pointer_callback() -> Any:
    """A Ray Train ``UserCallback`` that moves the run's ``latest`` pointer to each persisted checkpoint."""
    import ray.train

    class LatestCheckpointPointer(ray.train.UserCallback):
        def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
            if checkpoint is not None:
                write_latest(checkpoint.filesystem, checkpoint.path)

    return LatestCheckpointPointer()
