"""Experiment trackers beyond the run directory: ``train.report_to: [tensorboard, wandb, mlflow]``.

    RunLogs.log_metrics(row)  (rank 0, every metrics row: per step, per chunk, per evaluation)
        ├─ metrics.jsonl / metrics.csv / domains.csv     always
        ├─ tb/                                           "tensorboard" (the default)
        ├─ W&B run       ray.air.integrations.wandb.setup_wandb   "wandb"   (pip install 'd3ray[wandb]')
        └─ MLflow run    ray.air.integrations.mlflow.setup_mlflow "mlflow"  (pip install 'd3ray[mlflow]')

Ray Train's documented pattern for W&B and MLflow is to call ``setup_wandb`` / ``setup_mlflow`` inside
the training function; d3ray does it in rank 0's ``RunLogs``, so every tracker receives the same
rows, with the same ``stage/name_unit`` keys, as ``metrics.jsonl``. Credentials, project, mode and
tracking URI come from the trackers' own environment variables (``WANDB_MODE=offline``,
``WANDB_PROJECT``, ``WANDB_DIR``, ``MLFLOW_TRACKING_URI``, ``MLFLOW_EXPERIMENT_NAME``, ...), which
d3ray passes on to every Ray worker (``d3ray.run.cluster.passthrough_env``). Without ``WANDB_DIR`` the W&B
files go to the run directory; without ``MLFLOW_TRACKING_URI``, MLflow writes a file store in
``<run_dir>/mlruns`` (MLflow 3 keeps its file store behind ``MLFLOW_ALLOW_FILE_STORE``, which d3ray sets
for a local store; a database or server URI is used as given).

MLflow's metric names have ``.`` for ``/`` (``train.loss``, ``eval.<domain>.loss``: :func:`mlflow_keys`).
A resumed run continues the same W&B run (its id is derived from the run directory); MLflow gets a
new run of the same name per attempt (``setup_mlflow`` takes no run id).
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

#: ``train.report_to`` names → (the module it needs, the extra that installs it; None: core).
TRACKERS: dict[str, tuple[str, str | None]] = {
    "tensorboard": ("tensorboard", None),
    "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow"),
}


def tracker_problem(name: str, importable: Any) -> str | None:
    """A one-line problem when tracker ``name`` cannot run here (its optional extra is not installed)."""
    module, extra = TRACKERS[name]
    if extra is None or importable(module):
        return None
    return (f"train.report_to lists {name!r}, which needs the {module} package: pip install 'd3ray[{extra}]' "
            f"(or remove {name} from train.report_to)")


def flat_config(tree: Any, prefix: str = "") -> dict[str, Any]:
    """A nested config dict as ``{"train.lr": 0.003, ...}`` (lists as strings): what trackers log as params."""
    out: dict[str, Any] = {}
    if isinstance(tree, dict):
        for key, value in tree.items():
            out.update(flat_config(value, f"{prefix}{key}."))
        return out
    out[prefix[:-1]] = tree if isinstance(tree, int | float | str | bool) or tree is None else str(tree)
    return out


def scalar_items(row: dict[str, Any]) -> dict[str, float]:
    """The finite numeric values of a metrics row, ``step`` excluded (what a tracker plots)."""
    return {k: float(v) for k, v in row.items()
            if k != "step" and isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)}


def mlflow_keys(values: dict[str, float]) -> dict[str, float]:
    """MLflow's metric names: ``/`` becomes ``.`` (``train/loss/<domain>`` → ``train.loss.<domain>``). MLflow's
    file store keeps each metric as a file at its name's path, so ``train/loss/<domain>`` cannot sit
    below the file ``train/loss``."""
    return {k.replace("/", "."): v for k, v in values.items()}


class Trackers:
    """The W&B and MLflow runs of one training run (rank 0); ``tensorboard`` is RunLogs' own ``tb/``."""

    def __init__(self, report_to: list[str] | tuple[str, ...], run_dir: Path, run_name: str,
                 config: dict[str, Any] | None = None) -> None:
        self._wandb: Any = None
        self._mlflow: Any = None
        params = flat_config(config or {})
        if "wandb" in report_to:
            from ray.air.integrations.wandb import setup_wandb

            run_id = f"{run_name}-{hashlib.sha1(str(run_dir).encode()).hexdigest()[:8]}"
            kwargs: dict[str, Any] = {} if os.environ.get("WANDB_DIR") else {"dir": str(run_dir)}
            self._wandb = setup_wandb(config=params, rank_zero_only=False, id=run_id, name=run_name,
                                      trial_id=run_id, trial_name=run_name, resume="allow", **kwargs)
        if "mlflow" in report_to:
            from ray.air.integrations.mlflow import setup_mlflow

            given = os.environ.get("MLFLOW_TRACKING_URI")
            uri = None if given else (run_dir / "mlruns").as_uri()
            if "://" not in (given or "file://") or (given or "file:").startswith("file:"):
                # MLflow 3 refuses its file store unless opted in; a local store is what d3ray's default is
                os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            self._mlflow = setup_mlflow(config=params, tracking_uri=uri, run_name=run_name,
                                        experiment_name=os.environ.get("MLFLOW_EXPERIMENT_NAME") or "d3ray",
                                        create_experiment_if_not_exists=True, rank_zero_only=False)

    def log(self, row: dict[str, Any]) -> None:
        """One metrics row at its ``step``."""
        values = scalar_items(row)
        if not values:
            return
        step = int(row["step"])
        if self._wandb is not None:
            self._wandb.log(values, step=step)
        if self._mlflow is not None:
            self._mlflow.log_metrics(mlflow_keys(values), step=step)

    def close(self) -> None:
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None
        if self._mlflow is not None:
            self._mlflow.end_run()
            self._mlflow = None
