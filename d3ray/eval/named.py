"""lm-eval's own tasks by name (``--tasks lambada_openai``) and user task folders (``--include-path DIR``).

    NAME[,NAME...] ─► TaskManager(include_path=DIR)    the folder's YAML tasks only (fast), or, when a
        │                                               name is not there, lm-eval's bundled tasks too (~45 s)
        ▼ data_problem(name, config): is the task's data here?
        │   dataset_path json/csv/parquet/text/arrow + dataset_kwargs.data_files → the files exist
        │   dataset_path a local folder → yes
        │   dataset_path a Hugging Face dataset id → in the local datasets cache (offline: nothing is fetched)
        ▼
    PreparedTask(kind "lm-eval", configs=[NAME]) → lm_eval.simple_evaluate(..., TaskManager(same index))

Nothing downloads: ``d3ray eval`` runs with ``HF_DATASETS_OFFLINE=1``, so a task whose dataset is not in
the local cache would fail deep inside ``datasets``; it is refused first, in one line, instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from d3ray.eval.harness import PreparedTask
from d3ray.eval.inputs import EvalInputError, EvalTask

#: ``datasets`` builders that read local files named by ``dataset_kwargs.data_files``.
FILE_BUILDERS = ("json", "csv", "parquet", "text", "arrow")


def _files(data_files: Any) -> Iterator[str]:
    if isinstance(data_files, str):
        yield data_files
    elif isinstance(data_files, dict):
        for value in data_files.values():
            yield from _files(value)
    elif isinstance(data_files, list | tuple):
        for value in data_files:
            yield from _files(value)


def data_problem(name: str, config: dict[str, Any], cached: Callable[[str, str | None], bool]) -> str | None:
    """Why task ``name``'s data is not local (one line), or None when it is.

    Args:
        name: the lm-eval task name.
        config: its task config (lm-eval's YAML, resolved).
        cached: whether a Hugging Face dataset (path, config name) is in the local datasets cache.
    """
    if config.get("custom_dataset") is not None or "class" in config:  # a Python task loads its own data
        return None
    path = config.get("dataset_path")
    if not path:
        return f"--tasks {name}: the task names no dataset_path"
    if path in FILE_BUILDERS:
        files = list(_files((config.get("dataset_kwargs") or {}).get("data_files")))
        if not files:
            return f"--tasks {name}: dataset_path {path} needs dataset_kwargs.data_files (local files)"
        missing = [f for f in files if "://" in f or not Path(f).expanduser().exists()]
        if missing:
            return (f"--tasks {name}: data file {missing[0]} is not a local file (data_files paths are read "
                    f"relative to the current directory; give absolute paths)")
        return None
    if Path(path).expanduser().is_dir():
        return None
    subset = config.get("dataset_name")
    if cached(path, subset):
        return None
    label = path + (f" ({subset})" if subset else "")
    return (f"--tasks {name}: its data, the Hugging Face dataset {label}, is not local (not in the datasets "
            f"cache; d3ray eval downloads nothing): load it once where the hub is reachable and copy HF_HOME "
            f"here, or give the examples as a KIND=FILE task")


def hub_dataset_cached(path: str, subset: str | None) -> bool:
    """Whether ``datasets`` can build (path, subset) from the local cache alone (``HF_DATASETS_OFFLINE=1``)."""
    import datasets

    try:
        datasets.load_dataset_builder(path, subset)
    except Exception:  # any failure to find it offline means: not local (the caller says so in one line)
        return False
    return True


def _leaf_tasks(manager: Any, name: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(task name, config) of a task, or of every task of a group or tag (recursively), from lm-eval's
    index (its YAML parsed, includes resolved; no dataset is loaded)."""
    index = manager.task_index
    entry = index[name]
    kind = entry.kind.name
    if kind == "TAG":
        members: list[Any] = [k for k, e in index.items() if name in e.tags]
    elif kind == "GROUP":
        members = (entry.cfg or {}).get("task") or []
        members = members if isinstance(members, list) else [members]
    else:
        yield name, dict(entry.cfg or {})
        return
    for member in members:
        if isinstance(member, str) and member in index:
            yield from _leaf_tasks(manager, member)
        elif isinstance(member, dict):
            yield str(member.get("task", name)), member


def task_index(names: list[str], include_path: str | None) -> tuple[Any, bool]:
    """The lm-eval ``TaskManager`` that knows ``names`` (and whether it needed lm-eval's bundled tasks).

    Raises:
        EvalInputError: an include path that is no folder, or a name no index has.
    """
    from lm_eval.tasks import TaskManager

    if include_path is not None and not Path(include_path).is_dir():
        raise EvalInputError(f"--include-path {include_path}: no such folder (a folder of lm-eval task YAML files)")
    if include_path is not None:
        manager = TaskManager(include_path=include_path, include_defaults=False)
        if all(n in manager.all_tasks for n in names):
            return manager, False
    manager = TaskManager(include_path=include_path, include_defaults=True)
    unknown = [n for n in names if n not in manager.all_tasks]
    if unknown:
        where = f" or in {include_path}" if include_path else " (add --include-path DIR for your own task YAMLs)"
        raise EvalInputError(f"--tasks {','.join(unknown)}: no such lm-eval task among lm-eval's tasks{where}")
    return manager, True


def prepare_named_tasks(names: list[str], include_path: str | None,
                        cached: Callable[[str, str | None], bool] = hub_dataset_cached) -> list[PreparedTask]:
    """lm-eval tasks by name, each checked to have its data here (before any model is loaded).

    Raises:
        EvalInputError: an unknown name, or a task whose data is not local (one line naming the task).
    """
    manager, defaults = task_index(names, include_path)
    prepared = []
    for name in names:
        for leaf, config in _leaf_tasks(manager, name):
            problem = data_problem(leaf, config, cached)
            if problem:
                raise EvalInputError(problem)
        prepared.append(PreparedTask(EvalTask(kind="lm-eval", path=include_path or "", name=name), [name], 0,
                                     index=(include_path, defaults)))
    return prepared
