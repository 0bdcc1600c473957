"""RunConfig: the composition of the stage configs plus run-level fields.

One YAML file (``jobs/configs/*.yaml``) holds the values; dotted overrides change them on the
command line (``--train.steps=200 --schedule.type=d3``). Unknown keys are errors naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from d3ray.data.config import DataConfig
from d3ray.data.sft import SftDataConfig
from d3ray.model import ModelConfig
from d3ray.schedule.config import ScheduleConfig
from d3ray.schedule.order.configs import D3ScheduleConfig
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
    """Ray Train controller poll interval; each ``report`` costs about this (RAY_NOTES section 1)."""


#: The no-argument run shows the product: D3 on the tiny model with the influence defaults (first_order
#: with the AdamW step, a 16,384-dim sketch of an eighth of each batch's sequences over all parameters:
#: the knobs ``d3ray bench influence`` picked and ``d3ray bench pipeline`` measures), the influence actor
#: at background priority so that the trainers keep the cores.
FIRST_RUN_SCHEDULE = D3ScheduleConfig(influence_nice=19)


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

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir).expanduser().resolve() / self.name
