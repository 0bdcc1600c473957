"""Seeded sampling of responses from a causal LM (the policy of the NICE selector), on the scoring actor.

    prompt ids (p,) ──repeat S──► (S, p) ──► forward with the KV cache, one new token per step:
        temperature > 0: a draw from softmax(logits / temperature) with a torch.Generator of its own
        temperature = 0: argmax (greedy; the S responses are then identical)
    a row stops at its first EOS (kept: the policy chose to stop) or after ``max_new_tokens``

Deterministic: the draws depend only on the model's logits and the generator's seed (the caller
derives it from run seed, weights version and example), never on the global torch RNG.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def sample_responses(model: Any, prompt_ids: np.ndarray, samples: int, max_new_tokens: int, temperature: float,
                     seed: int, eos_id: int) -> list[np.ndarray]:
    """``samples`` responses to one prompt, each the sampled tokens up to and including its first EOS.

    Args:
        model: a transformers causal LM (eval mode) with a KV cache.
        prompt_ids: (p,) the rendered prompt's token ids (p >= 1).
        samples: S, responses drawn.
        max_new_tokens: at most this many tokens per response.
        temperature: softmax temperature of the draws; 0 = greedy.
        seed: seeds the draws (a ``torch.Generator`` of this call only).
        eos_id: the token that ends a response.

    Returns:
        S int64 arrays of 1..max_new_tokens tokens (an array ends with ``eos_id`` iff the row stopped).
    """
    import torch

    if samples < 1 or max_new_tokens < 1 or temperature < 0:
        raise ValueError(f"sample_responses: samples={samples}, max_new_tokens={max_new_tokens} must be >= 1 and "
                         f"temperature={temperature} >= 0")
    prompt = np.asarray(prompt_ids, dtype=np.int64)
    if prompt.ndim != 1 or len(prompt) == 0:
        raise ValueError(f"sample_responses: prompt_ids must be a non-empty 1-D array, got shape {prompt.shape}")
    import transformers

    cache_kw = "cache" if int(transformers.__version__.split(".")[0]) >= 5 else "past_key_values"  # renamed in 5
    device = next(model.parameters()).device  # the draws are seeded per device type
    generator = torch.Generator(device=device).manual_seed(int(seed))
    step_input = torch.as_tensor(prompt, device=device)[None].repeat(samples, 1)  # (S, p)
    done = torch.zeros(samples, dtype=torch.bool, device=device)
    tokens, past = [], None
    with torch.no_grad():
        for _ in range(max_new_tokens):
            out = model(input_ids=step_input, use_cache=True, **({} if past is None else {cache_kw: past}))
            past = out[cache_kw] if cache_kw in out else out.past_key_values
            logits = out.logits[:, -1].float()  # (S, V)
            if temperature == 0:
                nxt = logits.argmax(dim=-1)
            else:
                probs = torch.softmax(logits / temperature, dim=-1)
                nxt = torch.multinomial(probs, 1, generator=generator)[:, 0]
            nxt = torch.where(done, torch.full_like(nxt, eos_id), nxt)
            tokens.append(nxt)
            done |= nxt == eos_id
            if bool(done.all()):
                break
            step_input = nxt[:, None]
    drawn = torch.stack(tokens, dim=1).cpu().numpy()  # (S, n)
    out_rows = []
    for row in drawn:
        stops = np.flatnonzero(row == eos_id)
        out_rows.append(row[: stops[0] + 1] if len(stops) else row)
    return out_rows
