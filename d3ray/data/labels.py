"""Labels for causal-LM losses from packed or padded sequences: -100 wherever no loss is taken.

One function for every place that scores sequences (the trainers' step, evaluation, influence and
scoring actors), so that they all agree on which tokens count. The model shifts labels itself
(Hugging Face convention): ``labels[t]`` is the target of the prediction made at position t - 1.
"""

from __future__ import annotations

import numpy as np

IGNORE_INDEX = -100


def lm_labels(input_ids: np.ndarray, n_tokens: np.ndarray, loss_mask: np.ndarray | None = None) -> np.ndarray:
    """Labels (B, T) int64: the ids, with -100 past each row's ``n_tokens`` and where ``loss_mask`` is False.

    Args:
        input_ids: (B, T) token ids.
        n_tokens: (B,) valid tokens per row (the rest is padding).
        loss_mask: (B, T) bool, True where a token is a target (e.g. SFT response tokens); None = all.
    """
    ids = np.asarray(input_ids)
    labels = ids.astype(np.int64, copy=True)
    positions = np.arange(ids.shape[1])[None, :]
    labels[positions >= np.asarray(n_tokens)[:, None]] = IGNORE_INDEX
    if loss_mask is not None:
        labels[~np.asarray(loss_mask, dtype=bool)] = IGNORE_INDEX
    return labels
