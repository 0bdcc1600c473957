"""A run directory's files: reading its JSONL logs, and routing a process's logs into ``logs/``.

The trainer writes ``metrics.jsonl``, ``samples.jsonl``, ``schedule_log.jsonl``
(``d3ray.train.metrics.RunLogs``); plots, benchmarks, sweeps and tests read them. Each line is one
JSON object; a missing file reads as no rows. Every Ray process of a run (trainers, coordinator,
scheduler actors) logs into ``<run_dir>/logs/<role>.log`` and keeps the console for warnings.
Directories that readers load whole (exports, tokenizers) are written with :func:`atomic_directory`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """All rows of a JSONL file ([] if absent)."""
    path = Path(path)
    if not path.exists():
        return []
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def route_logs_to_run_dir(run_dir: Path, role: str, console_level: int = logging.WARNING) -> Path:
    """In a Ray worker or actor process: INFO and up go to ``<run_dir>/logs/<role>.log``, and the
    console (which Ray forwards to the driver) shows only ``console_level`` and up.

    Standard logging configuration: the process's console handlers get a level, and
    :func:`log_to_file` adds the file. Progress lines are printed, not logged, and stay on the console.
    """
    for handler in logging.getLogger().handlers:
        if not isinstance(handler, logging.FileHandler):
            handler.setLevel(console_level)
    return log_to_file(run_dir, role)


def log_to_file(run_dir: Path, role: str) -> Path:
    """Add ``<run_dir>/logs/<role>.log`` (INFO and up, and Python warnings) to this process's logging."""
    path = Path(run_dir) / "logs" / f"{role}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    if any(isinstance(h, logging.FileHandler) and Path(h.baseFilename) == path for h in root.handlers):
        return path
    file_handler = logging.FileHandler(path)
    file_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    file_handler.setLevel(logging.INFO)
    root.addHandler(file_handler)
    if root.level == logging.NOTSET or root.level > logging.INFO:
        root.setLevel(logging.INFO)
    # Python warnings (e.g. a library's deprecation notice) become log records of the file only.
    logging.captureWarnings(True)
    warnings_logger = logging.getLogger("py.warnings")
    warnings_logger.propagate = False
    warnings_logger.addHandler(file_handler)
    return path


def stop_logging_to_file(path: Path) -> None:
    """Detach and close the handler :func:`log_to_file` added for ``path`` (a driver that runs several
    runs in one process, e.g. a sweep or a compare grid, would otherwise log every later run into it)."""
    root, warnings_logger = logging.getLogger(), logging.getLogger("py.warnings")
    for handler in list(root.handlers):
        if isinstance(handler, logging.FileHandler) and Path(handler.baseFilename) == Path(path):
            root.removeHandler(handler)
            warnings_logger.removeHandler(handler)
            handler.close()


@contextlib.contextmanager
def atomic_directory(out: Path) -> Iterator[Path]:
    """Write a directory all at once: yields a temporary sibling to fill, which replaces ``out`` when
    the block ends without an error (a reader never sees a half-written directory); removed otherwise."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        yield tmp
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
