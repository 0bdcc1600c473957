"""Per-sequence causal-LM losses, and the (optionally weighted) step loss built from them.

Used by the trainers' step, evaluation and the scoring actors, so that every place agrees with the
Hugging Face definition: the loss of a batch is the mean over its target tokens of the next-token
cross-entropy (labels shifted by one, -100 ignored). Keeping the per-sequence sums lets the trainers
hand per-sample losses to the schedulers (feedback) and weight samples in the step at no extra
forward pass.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def sequence_losses(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sequence cross-entropy sums and target counts.

    Args:
        logits: (b, T, V) next-token logits at every position.
        labels: (b, T) targets, -100 where no loss is taken (position t is predicted at t - 1).

    Returns:
        (sums (b,) float32, counts (b,) float32): Σ_t CE over the targets of each sequence, and their number.
    """
    # Shift the labels, not the logits (as Hugging Face's loss does): the logits stay one contiguous
    # (b·T, V) view, with no copy of the largest tensor of the step in the forward or the backward;
    # the last position, which predicts nothing, gets the ignored label (a 0 term).
    b, t, v = logits.shape
    target = F.pad(labels[:, 1:], (0, 1), value=-100)  # (b, T)
    pred = logits if logits.dtype == torch.float32 else logits.float()
    ce = F.cross_entropy(pred.reshape(b * t, v), target.reshape(-1), ignore_index=-100, reduction="none")
    valid = (target != -100).float()
    return ce.view(b, t).sum(dim=1), valid.sum(dim=1)  # ignored targets already cost 0


def step_loss(sums: torch.Tensor, counts: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """The loss of one micro-batch.

    Unweighted: the token mean Σ sums / Σ counts (the Hugging Face loss). Weighted: the mean over
    sequences of ``weights_i · sums_i / counts_i`` (each sequence's token-mean loss times its weight;
    weights of mean 1 make a uniform weighting equal the per-sequence mean).
    """
    if weights is None:
        return sums.sum() / counts.sum().clamp(min=1.0)
    per_seq = sums / counts.clamp(min=1.0)
    return (weights.to(per_seq.dtype) * per_seq).mean()
