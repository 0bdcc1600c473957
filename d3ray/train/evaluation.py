"""Held-out evaluation: per-domain validation loss and perplexity, and out-of-domain text.

Every rank runs the same number of forward passes (ZeRO-3 gathers parameters inside forward,
a collective), each on its own rows; token-weighted loss sums are all-reduced.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from d3ray.data.labels import lm_labels
from d3ray.lm_loss import sequence_losses


@torch.no_grad()
def evaluate(
    engine,
    eval_sets: dict[str, Any],
    rank: int,
    world: int,
    micro_batch_size: int,
    device: torch.device,
) -> dict[str, float]:
    """Token-weighted mean loss and perplexity per eval set.

    Args:
        engine: the DeepSpeed engine (or any causal LM module returning ``.logits``).
        eval_sets: name → (n, T) int token ids (every token scored), or ``{input_ids, n_tokens,
            loss_mask}`` (SFT: only the response tokens scored).
    Returns:
        ``{"eval/<name>/loss": x, "eval/<name>/ppl": e^x, ...}`` plus ``eval/mean_loss`` over
        the in-domain sets (those not starting with ``ood:``).
    """
    was_training = engine.training
    engine.eval()
    out: dict[str, float] = {}
    for name in sorted(eval_sets):
        data = eval_sets[name]
        if isinstance(data, dict):
            ids_all, labels_all = data["input_ids"], lm_labels(data["input_ids"], data["n_tokens"], data["loss_mask"])
        else:
            ids_all, labels_all = data, np.asarray(data, dtype=np.int64)
        order = np.arange(len(ids_all))[rank::world]
        n_calls = math.ceil(math.ceil(len(ids_all) / world) / micro_batch_size)
        sums = torch.zeros(2, dtype=torch.float64)
        for i in range(n_calls):
            rows = order[i * micro_batch_size:(i + 1) * micro_batch_size]
            real = len(rows)
            if real == 0:  # keep collectives aligned: run a forward on one row, weight 0
                rows = np.arange(1)
            ids = torch.tensor(np.asarray(ids_all[rows]), dtype=torch.long, device=device)  # a copy: Ray's are read-only
            labels = torch.tensor(labels_all[rows], dtype=torch.long, device=device)
            loss_sums, counts = sequence_losses(engine(input_ids=ids).logits, labels)
            if real:
                sums += torch.stack([loss_sums.sum(), counts.sum()]).double().cpu()
        if world > 1:
            dist.all_reduce(sums)
        mean = float(sums[0] / sums[1]) if sums[1] > 0 else float("nan")
        out[f"eval/{name}/loss"] = mean
        out[f"eval/{name}/ppl"] = math.exp(min(mean, 50.0))
    in_domain = [v for k, v in out.items() if k.endswith("/loss") and not k.startswith("eval/ood:")]
    if in_domain:
        out["eval/mean_loss"] = float(np.mean(in_domain))
    if was_training:
        engine.train()
    return out
