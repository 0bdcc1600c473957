"""A run directory's files: reading its JSONL logs, and routing a process's logs into ``logs/``.

The trainer writes ``metrics.jsonl``, ``samples.jsonl``, ``schedule_log.jsonl``
(``d3ray.train.metrics.RunLogs``); plots, benchmarks, sweeps and tests read them. Each line is one
JSON object; a missing file reads as no rows. Every Ray process of a run (trainers, coordinator,
scheduler actors) logs into ``<run_dir>/logs/<role>.log`` and keeps the console for warnings.
Directories that readers load whole (exports, tokenizers) are written with :func:`atomic_directory`,
which never replaces a directory d3ray did not write (a user's model or data folder).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import posixpath
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from d3ray.errors import UserError

FINAL_METRICS = "final_metrics.json"
"""What ``run_pretrain`` writes last: a run directory holding it is a finished run."""


def display_path(path: str | Path) -> str:
    """``path`` as a report shows it: relative to the working directory when it lies inside it (a report
    committed from a checkout names no machine's absolute path), else absolute."""
    resolved = Path(path).expanduser().resolve()
    try:
        return resolved.relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return resolved.as_posix()


def new_directories(path: Path) -> list[Path]:
    """``path`` and those of its parents that do not exist yet, deepest first: what ``path.mkdir(parents=True)``
    will create, so that a rejected run removes exactly what it made (:func:`remove_new_run_dir`)."""
    made = []
    for p in [path, *path.parents]:
        if p.exists():
            break
        made.append(p)
    return made


def remove_new_run_dir(made: list[Path]) -> bool:
    """Remove a run directory this process created (``made``, from :func:`new_directories`) when the run
    stopped before its first step: no step row in ``metrics.jsonl``, no checkpoint. The parents it created go
    too if they are empty. A directory that existed before, and anything in one, is never touched. Returns
    whether it did."""
    if not made or not made[0].is_dir():
        return False
    run_dir = made[0]
    if has_trained(run_dir):
        return False
    shutil.rmtree(run_dir)
    for parent in made[1:]:
        with contextlib.suppress(OSError):  # not empty: another run's folder appeared in it meanwhile
            parent.rmdir()
    return True


def has_trained(run_dir: Path) -> bool:
    """Whether a run trained in ``run_dir``: a checkpoint there, or a step row in its ``metrics.jsonl`` (a run
    whose checkpoints live in ``storage_path`` logs its steps here too)."""
    return any(run_dir.glob("checkpoint_*")) or any("train/loss" in r for r in read_jsonl(run_dir / "metrics.jsonl"))


def is_finished(run_dir: str | Path) -> bool:
    """A run is finished once its ``final_metrics.json`` exists (``run_pretrain`` writes it last)."""
    return (Path(run_dir) / FINAL_METRICS).is_file()


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


@contextlib.contextmanager
def stdout_to_log(log: logging.Logger) -> Iterator[None]:
    """What a library prints inside the block becomes INFO lines of ``log`` (the process's log file), not
    console lines (DeepSpeed prints "... built successfully" for each op it loads, on every rank)."""
    buffer = io.StringIO()
    try:
        with contextlib.redirect_stdout(buffer):
            yield
    finally:
        for line in buffer.getvalue().splitlines():
            if line.strip():
                log.info("%s", line)


@contextlib.contextmanager
def stderr_to_file(path: Path) -> Iterator[None]:
    """File descriptor 2 of this process appends to ``path`` inside the block, C++ writes included.

    Ray's core worker logs a precautionary E-level line to fd 2 when an actor with ``max_restarts``
    gets handles or refs in its constructor arguments (ray-project/ray#53727); it has no setting to
    send it elsewhere. Where the driver owns those refs for the whole run (the coordinator's), the
    line belongs in the driver's log, not on the console.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    target = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.dup2(target, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(target)


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
def atomic_directory(out: Path, owned_marker: str) -> Iterator[Path]:
    """Write a directory all at once: yields a temporary sibling to fill, which replaces ``out`` when
    the block ends without an error (a reader never sees a half-written directory); removed otherwise.

    ``out`` is replaced only when it is missing, empty, or holds ``owned_marker`` (a file the writer
    puts in every directory it writes, e.g. ``d3ray_export.json``): a directory d3ray did not write is
    never removed. The check runs before the block, so nothing is computed for a refused target.

    Raises:
        UserError: ``out`` exists and is a file, or a non-empty directory without ``owned_marker``.
    """
    out = Path(out)
    refuse_foreign_directory(out, owned_marker)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        yield tmp
        refuse_foreign_directory(out, owned_marker)  # still ours: nothing appeared there meanwhile
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def refuse_foreign_directory(out: Path, owned_marker: str, what: str = "") -> None:
    """Raise a :class:`~d3ray.errors.UserError` unless ``out`` is missing, an empty directory, or a
    directory holding ``owned_marker`` (one d3ray wrote). ``what`` names the field or option in the message."""
    out = Path(out)
    if not out.exists():
        return
    where = f"{what}={out}" if what else str(out)
    if not out.is_dir():
        raise UserError(f"{where}: a file, which d3ray will not overwrite; choose a new directory")
    if any(out.iterdir()) and not (out / owned_marker).is_file():
        raise UserError(f"{where}: a non-empty directory d3ray did not write (no {owned_marker}), which it will "
                        "not replace; choose a new or empty directory, or remove this one yourself")


def write_generated_file(path: Path, data: bytes) -> None:
    """Write a generated file (the sample corpus, the skill suite) that the same arguments make
    byte-identical: an existing file is replaced only when it holds exactly these bytes, so a folder
    of the user's (``--out`` pointed at a real corpus with the same file names) is never overwritten.

    Raises:
        UserError: ``path`` exists with other content.
    """
    path = Path(path)
    if path.exists():
        if path.is_file() and path.read_bytes() == data:
            return
        raise UserError(f"{path}: exists and is not what d3ray would write there, so it is left as it is; "
                        "write the generated data into a new or empty folder (--out)")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


# The ``latest`` pointer of a run (``<storage_path>/<name>/latest``: the name of its newest checkpoint wholly
# in storage), moved by the Ray Train controller (d3ray/train/latest.py) and followed by export / eval / --from.
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
