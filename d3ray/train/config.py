"""Configs of the training stage: optimisation and evaluation (the model's is ``d3ray.model.ModelConfig``).

The DeepSpeed dict and Ray's ``ScalingConfig`` are produced *from* these at the edge
(``deepspeed_config.py``, ``run.py``); nothing below reads environment variables.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: ``train.checkpoint_upload``'s values (TrainConfig.checkpoint_upload says what each does).
CHECKPOINT_UPLOADS = ("auto", "direct", "async", "sync")


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Optimisation, parallelism and checkpointing of the DeepSpeed trainers."""

    steps: int = 120
    """Optimizer steps (one global batch each). The stream restarts (next epoch) if data runs out."""
    stop_at_step: int = 0
    """Stop (with a checkpoint) after this many steps while the LR schedule stays that of ``steps``:
    the shared trunk of a ``d3ray compare`` (``trunk:``). 0: train all ``steps``."""
    init_checkpoint: str | None = None
    """A checkpoint directory a fresh run starts from, with its full state (weights, optimizer, LR
    position, data cursor, and the schedule state the checkpoint carries): the arms of a compare
    trunk (``d3ray/lab/compare/trunk.py`` strips the trunk's scheduler state). Unused once the run has a
    checkpoint of its own (a resumed run)."""
    global_batch_size: int = 8
    """B: sequences per optimizer step, across all workers and accumulation micro-steps."""
    micro_batch_size: int = 4
    """Sequences per worker per forward/backward; gradient accumulation = B / (workers * micro)."""
    num_workers: int = 2
    """Data-parallel Ray Train workers, each one DeepSpeed engine."""
    cpus_per_worker: float = 0.5
    """CPUs Ray reserves per worker; keep some for Ray Data on small boxes (docs/design/ray.md §2)."""
    gpus_per_worker: float = 0.0
    """GPUs per worker; > 0 switches to NCCL, bf16 and CUDA."""
    resources_per_worker: dict[str, float] = field(default_factory=dict)
    """Custom Ray resources per worker, e.g. {"trainer_node": 0.01} to pin trainers to GPU nodes."""
    zero_stage: int = 2
    """DeepSpeed ZeRO stage 0-3."""
    precision: str = "auto"
    """``bf16``, ``fp32``, or ``auto``: bf16 on GPUs, fp32 on the CPU. Apart from the device: DeepSpeed's
    CPU accelerator trains in bf16 too (how the test suite runs the bf16 path without a GPU)."""
    lr: float = 3e-3
    """Peak learning rate."""
    min_lr_ratio: float = 0.1
    """Cosine decay ends at lr * min_lr_ratio."""
    warmup_steps: int = 10
    """Linear warmup steps."""
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    """Global gradient-norm clip (0 disables)."""
    log_every: int = 10
    """A console progress line every this many steps (rank 0)."""
    eval_every: int = 60
    """Validation every this many steps (and always at the end); 0 = only at the end."""
    checkpoint_every_chunks: int = 1
    """Report a checkpoint every this many chunks (each report costs ~0.2-2 s in Ray Train, and a
    synchronous save of the DeepSpeed state: ~1.7 GB at GPT-2 124M). A resumed run restarts from the
    last checkpoint written and trains the chunks after it again (exactly once in the final model)."""
    checkpoint_every_steps: int = 0
    """Checkpoint at the end of the chunk that crosses each multiple of this many steps, instead of
    every ``checkpoint_every_chunks`` chunks (checkpoints fall on chunk boundaries, where the schedule
    state is whole); 0 = count in chunks."""
    checkpoint_upload: str = "auto"
    """How a checkpoint reaches ``storage_path``: ``direct`` (each rank saves its part straight into the
    checkpoint's directory there; nothing is copied: for a filesystem path every rank sees, a local disk
    or NFS), ``async`` (each rank saves to a temporary directory and Ray Train copies it while training
    goes on; a checkpoint counts, for resume and ``latest``, once it is all in storage) or ``sync`` (the
    copy before training goes on); ``auto``: ``direct`` where ``storage_path`` is a filesystem path,
    ``async`` where it is a URI (``s3://``, ``gs://``)."""
    checkpoint_every_sec: float = 0.0
    """Also (or, with ``checkpoint_every_chunks`` set high, only) checkpoint at the end of the first chunk
    that finishes this many seconds after the previous checkpoint (rank 0's clock, shared with every
    rank); 0 = no time-based checkpoints. The end of the run is always checkpointed."""
    keep_checkpoints: int = 2
    """Checkpoints kept by Ray Train."""
    max_failures: int = 0
    """Ray Train FailureConfig.max_failures: worker-group restarts from the latest checkpoint."""
    keep_freed_memory: bool = True
    """Each trainer keeps what a step frees for the next (glibc's ``mallopt``: allocations up to 32 MiB from
    the heap, up to 1 GiB freed kept): a CPU step then does not map and fault in its buffers anew
    (d3ray/train/allocator.py). No effect without glibc; off: glibc's own thresholds."""
    activation_checkpointing: bool = False
    """Recompute each transformer block's activations in the backward instead of keeping them
    (transformers' activation checkpointing, non-reentrant): less activation memory for about
    one more forward per step. The losses and gradients are the same."""
    deepspeed: dict[str, Any] = field(default_factory=dict)
    """DeepSpeed config keys merged over the one d3ray generates (``deepspeed_config.py``), e.g.
    ``{zero_optimization: {offload_optimizer: {device: cpu}, offload_param: {device: cpu}}}``. A key that
    a typed field sets (ZeRO stage, batch sizes, optimizer lr / betas / weight decay, precision, clipping,
    the LR schedule) is refused unless it equals the typed value or is ``auto``; set the ``train.`` field."""
    report_to: list[str] = field(default_factory=lambda: ["tensorboard"])
    """Trackers that receive every metrics row besides ``metrics.jsonl``: ``tensorboard`` (``tb/``),
    ``wandb`` (``d3ray[wandb]``), ``mlflow`` (``d3ray[mlflow]``), through Ray's ``setup_wandb`` /
    ``setup_mlflow``; configured by their own env vars (``WANDB_MODE``, ``MLFLOW_TRACKING_URI``...).
    ``[]``: the run directory's files only."""

    def __post_init__(self) -> None:
        per_step = self.num_workers * self.micro_batch_size
        if self.precision not in ("auto", "bf16", "fp32"):
            raise ValueError(f"train.precision={self.precision!r} must be auto, bf16 or fp32")
        if self.steps < 1:
            raise ValueError(f"train.steps={self.steps} must be >= 1")
        if not 0 <= self.stop_at_step < self.steps:
            raise ValueError(f"train.stop_at_step={self.stop_at_step} must be in [0, train.steps={self.steps})")
        if self.num_workers < 1:
            raise ValueError(f"train.num_workers={self.num_workers} must be >= 1")
        if self.global_batch_size % per_step:
            raise ValueError(
                f"train.global_batch_size={self.global_batch_size} must be a multiple of "
                f"train.num_workers*train.micro_batch_size={per_step}: lower train.micro_batch_size "
                f"or raise train.global_batch_size"
            )
        if self.num_workers > 1 and 0 < self.gpus_per_worker <= 0.5:
            raise ValueError(
                f"train.gpus_per_worker={self.gpus_per_worker} with train.num_workers={self.num_workers} puts two "
                f"ranks on one GPU (NCCL refuses a duplicate GPU): set train.gpus_per_worker above 0.5 (1, or 0.75 "
                f"to leave 0.25 to an influence actor) or train.num_workers=1"
            )
        if self.gpus_per_worker > 1 and self.gpus_per_worker != int(self.gpus_per_worker):
            raise ValueError(f"train.gpus_per_worker={self.gpus_per_worker}: above 1 Ray takes whole GPUs only "
                             f"(set train.gpus_per_worker={int(self.gpus_per_worker)} or "
                             f"{int(self.gpus_per_worker) + 1})")
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"train.zero_stage={self.zero_stage} must be 0, 1, 2 or 3")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"train.min_lr_ratio={self.min_lr_ratio} must be in [0, 1]")
        if self.checkpoint_every_chunks < 1:
            raise ValueError(f"train.checkpoint_every_chunks={self.checkpoint_every_chunks} must be >= 1")
        if self.checkpoint_every_steps < 0:
            raise ValueError(f"train.checkpoint_every_steps={self.checkpoint_every_steps} must be >= 0 (0 = count chunks)")
        if self.checkpoint_upload not in CHECKPOINT_UPLOADS:
            raise ValueError(f"train.checkpoint_upload={self.checkpoint_upload!r} must be one of "
                             f"{', '.join(CHECKPOINT_UPLOADS)}")
        if self.checkpoint_every_sec < 0:
            raise ValueError(f"train.checkpoint_every_sec={self.checkpoint_every_sec} must be >= 0 (0 = off)")
        if self.deepspeed:
            from d3ray.train.deepspeed_config import deepspeed_config

            deepspeed_config(self)  # a key that conflicts with a typed field: one line, at load
        unknown = [name for name in self.report_to if name not in ("tensorboard", "wandb", "mlflow")]
        if unknown or len(set(self.report_to)) != len(self.report_to):
            raise ValueError(f"train.report_to={list(self.report_to)}: each of tensorboard, wandb, mlflow at most "
                             f"once (got {unknown or 'a duplicate'})")

    @property
    def grad_accum_steps(self) -> int:
        return self.global_batch_size // (self.num_workers * self.micro_batch_size)

    @property
    def use_gpu(self) -> bool:
        return self.gpus_per_worker > 0

    @property
    def bf16(self) -> bool:
        """Whether the trainers run bf16 (``precision``; ``auto`` follows the device)."""
        return self.precision == "bf16" or (self.precision == "auto" and self.use_gpu)


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    """Held-out evaluation: per-domain validation loss/perplexity plus out-of-domain text."""

    max_sequences_per_domain: int = 16
    """Validation sequences per domain (packed like training data)."""
    ood_text_paths: list[str] = field(default_factory=list)
    """Raw text files for out-of-domain perplexity, e.g. WikiText-2 raw test."""
    max_ood_sequences: int = 32
    """Sequences taken from each out-of-domain file."""
    micro_batch_size: int = 8
    """Sequences per evaluation forward pass."""
    sft_paths: list[str] = field(default_factory=list)
    """SFT runs: held-out SFT files whose per-task response loss is evaluated (default: the generated
    suite's test split when the suite is generated)."""
    tasks: str = ""
    """lm-evaluation-harness tasks run at every evaluation, ``KIND=FILE[,KIND=FILE...]`` with kinds
    ppl, domains, cloze, choice, sft (see ``d3ray eval``); ``{suite}`` is the generated SFT suite's
    directory. Empty: none."""
