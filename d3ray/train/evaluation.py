"""Held-out evaluation: per-domain validation loss and perplexity, and out-of-domain text.

Every rank runs the same number of forward passes (ZeRO-3 gathers parameters inside forward,
a collective), each on its own rows; token-weighted loss sums are all-reduced.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from d3ray.data.labels import lm_labels
from d3ray.model.lm_loss import sequence_losses
from d3ray.train.collectives import all_reduce_sum
from d3ray.train.trainer_rank import TrainerRank


@torch.no_grad()
def evaluate(
    trainer: TrainerRank,
    eval_sets: dict[str, Any],
    micro_batch_size: int,
    device: torch.device,
) -> dict[str, float]:
    """Token-weighted mean loss and perplexity per eval set.

    Args:
        trainer: this rank: its DeepSpeed engine (or any causal LM module returning ``.logits``) scores
            the rows ``rank, rank + world, ...`` of each set.
        eval_sets: name → (n, T) int token ids (every token scored), or ``{input_ids, n_tokens,
            loss_mask}`` (SFT: only the response tokens scored).
    Returns:
        ``{"eval/<name>/loss": x, "eval/<name>/ppl": e^x, "eval/<name>/loss_se": se, ...}`` plus
        ``eval/mean_loss`` over the in-domain sets (those not starting with ``ood:``) and its
        ``eval/mean_loss_se``. ``loss_se`` is the eval's own standard error: the loss is a ratio
        Σ s_i / Σ n_i of per-sequence loss sums s_i and target counts n_i, and sequences are the
        sampling unit, so (delta method) se² = Σ (s_i − x·n_i)² / (N (N − 1) n̄²); NaN for N < 2.
        The sets are independent: se of the mean over D sets is √(Σ se²) / D.
    """
    engine, rank, world = trainer.engine, trainer.rank, trainer.world
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
        sums = torch.zeros(6, dtype=torch.float64)  # Σs, Σn, Σs², Σs·n, Σn², N over sequences
        for i in range(n_calls):
            rows = order[i * micro_batch_size:(i + 1) * micro_batch_size]
            real = len(rows)
            if real == 0:  # keep collectives aligned: run a forward on one row, weight 0
                rows = np.arange(1)
            ids = torch.tensor(np.asarray(ids_all[rows]), dtype=torch.long, device=device)  # a copy: Ray's are read-only
            labels = torch.tensor(labels_all[rows], dtype=torch.long, device=device)
            loss_sums, counts = sequence_losses(engine(input_ids=ids).logits, labels)
            if real:
                s, n = loss_sums.double().cpu(), counts.double().cpu()
                sums += torch.stack([s.sum(), n.sum(), (s * s).sum(), (s * n).sum(), (n * n).sum(),
                                     torch.tensor(float(real), dtype=torch.float64)])
        if world > 1:
            sums = all_reduce_sum(sums)  # on the group's device (NCCL takes no CPU tensor)
        mean = float(sums[0] / sums[1]) if sums[1] > 0 else float("nan")
        out[f"eval/{name}/loss"] = mean
        out[f"eval/{name}/ppl"] = math.exp(min(mean, 50.0))
        out[f"eval/{name}/loss_se"] = _ratio_se(mean, *(float(v) for v in sums[1:]))
    in_domain = [k for k in out if k.endswith("/loss") and not k.startswith("eval/ood:")]
    if in_domain:
        out["eval/mean_loss"] = float(np.mean([out[k] for k in in_domain]))
        ses = [out[k + "_se"] for k in in_domain]
        out["eval/mean_loss_se"] = math.sqrt(sum(se * se for se in ses)) / len(ses)
    if was_training:
        engine.train()
    return out


def _ratio_se(mean: float, n_sum: float, s2: float, sn: float, n2: float, count: float) -> float:
    """Standard error of ``mean = Σs / Σn`` over ``count`` sequences (see :func:`evaluate`)."""
    if count < 2 or n_sum <= 0:
        return float("nan")
    residual = max(s2 - 2.0 * mean * sn + mean * mean * n2, 0.0)  # Σ (s_i − mean·n_i)²
    return math.sqrt(residual / (count * (count - 1))) / (n_sum / count)
