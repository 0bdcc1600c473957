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

from typing import Any

from d3ray.run_files import LATEST, read_latest, write_latest

__all__ = ["LATEST", "latest_pointer_callback", "read_latest", "write_latest"]


def latest_pointer_callback() -> Any:
    """A Ray Train ``UserCallback`` that moves the run's ``latest`` pointer to each persisted checkpoint."""
    import ray.train

    class LatestCheckpointPointer(ray.train.UserCallback):
        def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
            if checkpoint is not None:
                write_latest(checkpoint.filesystem, checkpoint.path)

    return LatestCheckpointPointer()
