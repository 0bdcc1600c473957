"""``import deepspeed`` without the 2.4 s that DeepSpeed's autotuner spends importing MLflow.

``deepspeed/__init__`` imports its autotuner, which does ``import mlflow`` at module level whenever
MLflow is installed (for autotuning experiments, which d3ray never runs). On a 2-core box that is
2.4 of the 5.2 s the import takes, paid again by every process that imports DeepSpeed: each
trainer rank, census worker and export. Each place where a d3ray process first imports DeepSpeed (the
trainers' loop, the census worker, export, the config check, the load-memory bench) calls
:func:`import_deepspeed`; code that runs only inside a trainer after that (snapshot.py,
sharded_influence.py) imports DeepSpeed's submodules directly. ``report_to: [mlflow]`` still imports
MLflow itself afterwards.
"""

from __future__ import annotations

import sys
import threading
from types import ModuleType

_lock = threading.Lock()


def import_deepspeed() -> ModuleType:
    """``deepspeed``, imported with MLflow hidden from it (unless this process has imported MLflow
    already): its autotuner sees MLflow as absent, and MLflow stays importable afterwards."""
    with _lock:
        if "deepspeed" in sys.modules:
            return sys.modules["deepspeed"]
        hide = "mlflow" not in sys.modules
        if hide:
            sys.modules["mlflow"] = None  # type: ignore[assignment]  # `import mlflow` raises ImportError
        try:
            import deepspeed
        finally:
            if hide and sys.modules.get("mlflow", 0) is None:
                del sys.modules["mlflow"]
        return deepspeed
