"""Held-out evaluation: per-domain validation loss and perplexity, and out-of-domain text.

Every rank runs the same number of forward passes (ZeRO-3 gathers parameters inside forward,
a collective), each on its own rows; token-weighted loss sums are all-reduced.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.distributed as dist

from d3ray.data.labels import lm_labels


def causal_lm_labels(
    input_ids: torch.Tensor, n_tokens: torch.Tensor, loss_mask: torch.Tensor | np.ndarray | None = None
) -> torch.Tensor:
    """Labels for next-token loss, on the inputs' device: :func:`d3ray.data.labels.lm_labels`
    (padding past ``n_tokens`` and positions where ``loss_mask`` is False get -100).

    input_ids: (b, T); n_tokens: (b,); loss_mask: (b, T) bool or None → labels (b, T) int64.
    """
    mask = None if loss_mask is None else np.asarray(torch.as_tensor(loss_mask).cpu())
    labels = lm_labels(input_ids.cpu().numpy(), n_tokens.cpu().numpy(), mask)
    return torch.from_numpy(labels).to(input_ids.device)


@torch.no_grad()
def evaluate(
    engine,
    eval_sets: dict[str, np.ndarray],
    rank: int,
    world: int,
    micro_batch_size: int,
    device: torch.device,
) -> dict[str, float]:
    """Token-weighted mean loss and perplexity per eval set.

    Args:
        engine: the DeepSpeed engine (or any module returning ``.loss``).
        eval_sets: name → (n, T) int token ids (full sequences).
    Returns:
        ``{"eval/<name>/loss": x, "eval/<name>/ppl": e^x, ...}`` plus ``eval/mean_loss`` over
        the in-domain sets (those not starting with ``ood:``).
    """
    was_training = engine.training
    engine.eval()
    out: dict[str, float] = {}
    for name in sorted(eval_sets):
        data = eval_sets[name]
        mine = data[rank::world]
        n_calls = math.ceil(math.ceil(len(data) / world) / micro_batch_size)
        sums = torch.zeros(2, dtype=torch.float64)
        for i in range(n_calls):
            rows = mine[i * micro_batch_size:(i + 1) * micro_batch_size]
            real = len(rows)
            if real == 0:  # keep collectives aligned: run a forward on one row, weight 0
                rows = data[:1]
            ids = torch.as_tensor(np.asarray(rows), dtype=torch.long, device=device)
            loss = engine(input_ids=ids, labels=ids).loss.double().cpu()
            if real:
                n_pred = real * (ids.shape[1] - 1)
                sums += torch.tensor([float(loss) * n_pred, n_pred], dtype=torch.float64)
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
