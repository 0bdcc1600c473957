"""ODM: Online Data Mixing as a multi-armed bandit over domains, EXP3 with the training loss as reward.

Albalak, Pan, Raffel & Wang 2023, "Efficient Online Data Mixing For Language Model Pre-Training"
(arXiv 2312.02406), Algorithm 1. With K domains, t the training step (batch) the policy is used at
(1, 2, ... after the warmup) and R̂ the smoothed reward estimates (R̂ = 0 and ε_0 = 1/K at the start):

    ε_t      = min(1/K, sqrt(ln K / (K·t)))                                   (exploration floor)
    π_t(i)   = (1 − K·ε_t) · exp(ε_{t−1}·R̂_i) / Σ_j exp(ε_{t−1}·R̂_j) + ε_t       (EXP3 policy)
    R̂_i     ← α·R̂_i + (1 − α)·r̂_i,   r̂_i = importance-weighted reward of domain i    (smoothing α)

The paper draws one domain per batch: r̂_i = ℓ/π(i) for the drawn domain (its batch loss ℓ) and 0 for
the others. Here every chunk draws each of its n = B·L sequences' domain from π (d3ray/data/mixture.py),
so a chunk is n such draws and the update uses their mean:

    r̂_i = (n_i / n) · ℓ̄_i / π(i)      (n_i sequences of domain i in the chunk, ℓ̄_i their mean loss)

which is unbiased for the expected loss of domain i (E[n_i / n] = π(i)), as the paper's estimator is,
with the chunk's n draws averaged instead of one. R̂ is updated once per chunk with feedback after
``warmup_chunks``, from the trainers' per-sample losses (``observe``), so the stream of chunk c uses
the feedback of the chunks before c − staleness (delayed feedback).

Both schedules count what the paper counts, training steps (batches), not chunks:

- t: chunk c is drawn with π_t at t = (c − warmup_chunks)·L + 1, the step of its first batch counted
  from the end of the warmup (``odm_step``), as DataFlex's ODM uses ``step − warmup_steps``. Counting
  chunk updates kept ε_t = 1/K, where π is exactly uniform whatever R̂ is, for the first K·ln K updates
  (14 chunks, 112 steps, at K = 7 and L = 8); counting steps, the mixture can leave uniform from
  chunk 2 (t = 17, steps 17 to 24) on, once one chunk's feedback is in.
- α: a chunk's update is the paper's smoothing once per batch of the chunk, with the chunk's reward:
  R̂_i ← α^L·R̂_i + (1 − α^L)·r̂_i. α = 0.9 keeps the paper's time constant of about 10 batches (once
  per chunk, R̂ would reach half the loss level only after 7 chunks, 56 steps at L = 8).

Departures: the rewards arrive once per chunk (the paper: every batch); DataFlex and the authors'
code additionally divide the reward by 10 and accumulate it without smoothing; here the paper's
α-smoothing is kept and the scale is ``reward_scale`` (1 = the loss itself). During ``warmup_chunks``
the mixture is uniform and feedback is not used (DataFlex's warmup_steps).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from d3ray.schedule.mix.base import MixerBase
from d3ray.schedule.scheduler import ChunkFeedback


def exploration_rate(t: int, k: int) -> float:
    """ε_t = min(1/K, sqrt(ln K / (K·t))) at training step t (t <= 0: ε_0 = 1/K)."""
    if t <= 0:
        return 1.0 / k
    return min(1.0 / k, math.sqrt(math.log(k) / (k * t)))


def odm_step(chunk_id: int, L: int, warmup_chunks: int) -> int:
    """The paper's t of chunk ``chunk_id``: the step of its first batch counted from the end of the
    warmup, ``(chunk_id − warmup_chunks)·L + 1``; 0 for a warmup chunk (drawn uniformly)."""
    if chunk_id < warmup_chunks:
        return 0
    return (chunk_id - warmup_chunks) * L + 1


def odm_policy(rewards: np.ndarray, t: int) -> np.ndarray:
    """π_t over K domains from the reward estimates R̂ (K,) at training step t (EXP3, the module's formula)."""
    rewards = np.asarray(rewards, dtype=np.float64)
    k = len(rewards)
    eps, eps_prev = exploration_rate(t, k), exploration_rate(t - 1, k)
    logits = eps_prev * rewards
    gibbs = np.exp(logits - logits.max())
    pi = (1.0 - k * eps) * gibbs / gibbs.sum() + eps
    return pi / pi.sum()


def chunk_rewards(domains: list[str], sample_domains: tuple[str, ...], losses: np.ndarray,
                  policy: dict[str, float], scale: float = 1.0) -> np.ndarray:
    """r̂ (K,): the importance-weighted rewards of one chunk drawn with ``policy`` (module docstring).

    Non-finite losses are left out (their sequences count as not drawn).
    """
    labels = np.asarray(sample_domains, dtype=object)
    losses = np.asarray(losses, dtype=np.float64)
    finite = np.isfinite(losses)
    n = int(finite.sum())
    out = np.zeros(len(domains))
    if n == 0:
        return out
    for i, d in enumerate(domains):
        mine = losses[(labels == d) & finite]
        if len(mine) and policy.get(d, 0.0) > 0:
            out[i] = scale * (len(mine) / n) * float(mine.mean()) / policy[d]
    return out


class OdmMixer(MixerBase):
    """EXP3 over the mixed domains (see the module docstring).

    Args:
        domains: the K mixed domains.
        alpha: smoothing of the reward estimates.
        warmup_chunks: chunks drawn uniformly first (their feedback is not used).
        reward_scale: multiplies the reward (the loss).
        L: the batches of a chunk, its training steps (the exploration schedule counts steps).
    """

    def __init__(self, domains: list[str], alpha: float, warmup_chunks: int, reward_scale: float,
                 L: int) -> None:
        self.domains = list(domains)
        self.alpha, self.warmup_chunks, self.reward_scale = alpha, warmup_chunks, reward_scale
        self.L = L
        self.rewards = np.zeros(len(self.domains))
        self.updates = 0

    def step(self, chunk_id: int) -> int:
        """The paper's t of chunk ``chunk_id`` (:func:`odm_step`)."""
        return odm_step(chunk_id, self.L, self.warmup_chunks)

    def decide(self, chunk_id: int) -> dict[str, float]:
        pi = odm_policy(self.rewards, self.step(chunk_id))
        return {d: float(p) for d, p in zip(self.domains, pi, strict=True)}

    def observe(self, feedback: ChunkFeedback, mixture: dict[str, float]) -> None:
        if feedback.chunk_id < self.warmup_chunks:
            return
        r = chunk_rewards(self.domains, feedback.domains, feedback.losses, mixture, self.reward_scale)
        decay = self.alpha ** self.L  # the paper's per-batch α, over the chunk's L batches
        self.rewards = decay * self.rewards + (1.0 - decay) * r
        self.updates += 1

    def record(self, chunk_id: int) -> dict[str, Any]:
        t = self.step(chunk_id)
        return {"odm_updates": self.updates, "odm_t": t, "odm_epsilon": exploration_rate(t, len(self.domains)),
                "odm_reward": {d: float(r) for d, r in zip(self.domains, self.rewards, strict=True)}}

    def state_dict(self) -> dict[str, Any]:
        return {"rewards": [float(r) for r in self.rewards], "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            self.rewards = np.asarray(state["rewards"], dtype=np.float64)
            self.updates = int(state["updates"])
