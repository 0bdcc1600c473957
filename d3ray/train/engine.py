"""A trainer rank's start: the process group, the model and its DeepSpeed engine, as one TrainerRank."""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

from d3ray.model import ModelConfig
from d3ray.train.config import TrainConfig
from d3ray.train.trainer_rank import TrainerRank

logger = logging.getLogger(__name__)

__all__ = ["start_trainer_rank"]


def start_trainer_rank(tcfg: TrainConfig, model: ModelConfig, seed: int, model_config: dict[str, Any], rank: int,
                       world: int) -> tuple[TrainerRank, Any]:
    """Join the trainers' process group and build this rank's engine (every rank calls, in step).

    The model is built from ``model_config`` (the transformers config the driver resolved) and ``model``
    under the run's ``seed`` (ZeRO-3: partitioned as it is built, ``zero.Init``), with activation
    checkpointing if asked, and handed to ``deepspeed.initialize`` with the DeepSpeed config and LR schedule
    of ``tcfg`` (the train config); the engine is left in train mode (``from_pretrained`` returns a model in eval mode: the
    model's own dropout trains).

    Returns:
        (the rank as a :class:`TrainerRank`, the torch device its steps run on).
    """
    import torch

    from d3ray.deepspeed_import import import_deepspeed
    from d3ray.model import build_model, enable_activation_checkpointing
    from d3ray.run_files import stdout_to_log
    from d3ray.train.deepspeed_config import deepspeed_config, lr_factor

    deepspeed = import_deepspeed()
    with stdout_to_log(logger):  # DeepSpeed announces each op it loads with a print: the log file, not the console
        deepspeed.init_distributed(dist_backend="nccl" if tcfg.use_gpu else "gloo")
    device = torch.device("cuda", torch.cuda.current_device()) if tcfg.use_gpu else torch.device("cpu")
    torch.manual_seed(seed)
    ds_config = deepspeed_config(tcfg)
    module = build_model(model_config, model, ds_config)  # ZeRO-3: built partitioned (zero.Init)
    if tcfg.zero_stage == 3:
        held = sum(p.ds_tensor.numel() for p in module.parameters())
        logger.info("rank %d built the model partitioned (ZeRO-3): holds %d of %d parameter values", rank, held,
                    sum(p.ds_numel for p in module.parameters()))
    if tcfg.activation_checkpointing:
        enable_activation_checkpointing(module)
    engine, _, _, _ = deepspeed.initialize(
        model=module,
        model_parameters=[p for p in module.parameters() if p.requires_grad],
        config=ds_config,
        lr_scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, partial(lr_factor, cfg=tcfg)),
    )
    engine.train()
    return TrainerRank(engine, rank, world, tcfg.zero_stage), device
