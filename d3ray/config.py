"""RunConfig: the composition of the stage configs plus run-level fields.

One YAML file (``jobs/configs/*.yaml``) holds the values; dotted overrides change them on the
command line (``--train.steps=200 --schedule.type=d3``). Unknown keys are errors naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from d3ray.config_loading import ConfigError, to_dict
from d3ray.data.config import DataConfig
from d3ray.data.sft import SftDataConfig
from d3ray.eval.inputs import parse_task_specs
from d3ray.model import ModelConfig
from d3ray.schedule.config import ScheduleConfig
from d3ray.schedule.order.d3 import NO_ARGUMENT_RUN
from d3ray.train.config import EvalConfig, TrainConfig


@dataclass(frozen=True, kw_only=True)
class RayClusterConfig:
    """How the driver connects to Ray."""

    address: str | None = None
    """``None`` or ``"local"`` starts a local instance; ``"auto"`` or ``ray://...`` joins a cluster."""
    num_cpus: int | None = None
    """Logical CPUs of a local instance (default: the machine's cores, at least 4 so that Ray
    Data, the coordinator and two trainers fit on a 2-core laptop)."""
    health_check_interval_s: float = 0.2
    """Ray Train controller poll interval; each ``report`` costs about this (docs/design/ray.md §2)."""
    env_vars: dict[str, str] = field(default_factory=dict)
    """Environment variables every Ray worker and actor gets (the job's ``runtime_env`` and Ray Train's
    ``worker_runtime_env``), on top of those passed through from the driver's environment: every
    ``HF_*``, ``TRANSFORMERS_*``, ``WANDB_*``, ``MLFLOW_*``, ``NCCL_*`` and ``AWS_*`` variable."""


#: The no-argument run shows the product: D3 on the tiny model, the order by the AdamW drift potential,
#: scored by the trainers themselves (``placement: {type: in_trainer}``), chunk 0 in stream order
#: (d3ray/schedule/order/d3/presets.py says why each).
FIRST_RUN_SCHEDULE = NO_ARGUMENT_RUN


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """A whole training run."""

    name: str = "d3ray-tiny"
    """Run name; re-running the same name in the same ``output_dir`` resumes it."""
    seed: int = 0
    """Seeds model init, data shuffling and every scheduler."""
    output_dir: str = "runs"
    """Parent of the run directory (a local path; checkpoints go to ``<output_dir>/<name>``)."""
    storage_path: str | None = None
    """Where Ray Train keeps checkpoints: a shared path or an s3:// / gs:// URI (multi-node clusters);
    default ``output_dir``. Logs and the tokenizer stay in ``<output_dir>/<name>``."""
    ray: RayClusterConfig = field(default_factory=RayClusterConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    sft: SftDataConfig | None = None
    """Supervised fine-tuning on ``{prompt, response, task}`` records (loss on response tokens only;
    ``task`` is the domain) instead of pre-training on ``data``; ``d3ray finetune`` sets it."""
    schedule: ScheduleConfig = field(default_factory=lambda: FIRST_RUN_SCHEDULE)
    """The data scheduler. The default is D3 with the knobs that keep up with two trainers on a
    2-core laptop (``d3ray bench pipeline``); ``--schedule.type=random`` is the baseline."""

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name:
            raise ValueError(f"name={self.name!r} must be a non-empty name without '/'")
        try:  # the scheduler's rules on the train config (D3's placement: the ZeRO stage it sketches under)
            self.schedule.check_train(self.train)
        except ValueError as err:
            raise ConfigError(str(err), key="schedule.placement") from None

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir).expanduser().resolve() / self.name


#: Every RunConfig field that holds local input paths (a path, a list of paths, or a path-or-keyword
#: such as a scheduler's ``reference``), by dotted key; a key applies where the run's config has it
#: (``schedule.reference`` only for the schedulers that have one). :func:`absolute_paths` makes them
#: absolute before a run starts in another directory or on another node (compare grids, sweep
#: trials). ``tests/unit/test_config_paths.py`` walks the whole config tree, every scheduler type
#: included, so a new path field that is not listed here fails it.
LOCAL_PATH_FIELDS = (
    "data.train_paths",
    "data.validation_paths",
    "data.tokenizer.path",
    "model.pretrained_path",
    "eval.ood_text_paths",
    "eval.sft_paths",
    "eval.tasks",
    "sft.paths",
    "schedule.reference",
    "schedule.order.reference",
)
#: Values of the path-or-keyword fields that name no path.
PATH_KEYWORDS = frozenset({"", "current", "initial"})


def absolute_paths(data: dict[str, Any] | RunConfig) -> dict[str, Any]:
    """A RunConfig (or its dict) as a dict whose :data:`LOCAL_PATH_FIELDS` are absolute local paths
    (URIs, keywords and ``{suite}`` placeholders stay as they are)."""
    out = to_dict(data)
    for key in LOCAL_PATH_FIELDS:
        *parents, leaf = key.split(".")
        node: Any = out
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict) or node.get(leaf) is None:
            continue
        value = node[leaf]
        if key == "eval.tasks":
            node[leaf] = ",".join(f"{t.kind}={_absolute(t.path)}" for t in parse_task_specs(value)) if value else value
        elif isinstance(value, list):
            node[leaf] = [_absolute(v) for v in value]
        else:
            node[leaf] = _absolute(value)
    return out


def _absolute(path: str) -> str:
    if path in PATH_KEYWORDS or "://" in path or path.startswith("{"):
        return path
    return str(Path(path).expanduser().resolve())
