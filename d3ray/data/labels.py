"""Next-token labels for a causal LM batch: the one place where labels are built.

Hugging Face causal LMs shift inside the model: ``labels[b, t]`` is the target of the logits at
position ``t - 1``, and ``-100`` (:data:`IGNORE_INDEX`) positions are not scored. So the labels are
the inputs themselves, with ``-100`` wherever no loss is wanted:

- past ``n_tokens[b]`` (EOS padding of a stream tail or of a padded SFT row), and
- where ``loss_mask[b, t]`` is False (SFT prompt tokens: only the response, and the EOS after it,
  are predicted).

    input_ids  p0 p1 p2 r0 r1 E  E  E      n_tokens 6, loss_mask 0 0 0 1 1 1 0 0
    labels     -  -  -  r0 r1 E  -  -      (- = -100; r0 is predicted from p2's logits)

Pure NumPy; the trainers, the evaluation and the influence workers build labels with it.
"""

from __future__ import annotations

import numpy as np

IGNORE_INDEX = -100


def lm_labels(input_ids: np.ndarray, n_tokens: np.ndarray, loss_mask: np.ndarray | None = None) -> np.ndarray:
    """Labels for the next-token loss of a (B, T) batch.

    Args:
        input_ids: (B, T) int token ids.
        n_tokens: (B,) real tokens per row; positions ``t >= n_tokens[b]`` get no loss.
        loss_mask: optional (B, T) bool; positions where it is False get no loss.

    Returns:
        (B, T) int64: ``input_ids`` with :data:`IGNORE_INDEX` at unscored positions.

    Raises:
        ValueError: the shapes do not agree.
    """
    ids = np.asarray(input_ids)
    if ids.ndim != 2:
        raise ValueError(f"input_ids must be (B, T), got shape {ids.shape}")
    n = np.asarray(n_tokens).reshape(-1)
    if n.shape[0] != ids.shape[0]:
        raise ValueError(f"n_tokens has {n.shape[0]} rows, input_ids {ids.shape[0]}")
    labels = ids.astype(np.int64, copy=True)
    labels[np.arange(ids.shape[1])[None, :] >= n[:, None]] = IGNORE_INDEX
    if loss_mask is not None:
        mask = np.asarray(loss_mask, dtype=bool)
        if mask.shape != ids.shape:
            raise ValueError(f"loss_mask has shape {mask.shape}, input_ids {ids.shape}")
        labels[~mask] = IGNORE_INDEX
    return labels


def batch_width(n_tokens: np.ndarray) -> int:
    """The widest row of a batch: slicing a padded (B, T) batch to ``[:, :batch_width]`` before the
    forward pass drops only padding (per-batch dynamic padding), and leaves every loss unchanged."""
    return int(np.max(n_tokens)) if len(n_tokens) else 0
