"""The baselines of mixing: a fixed mixture (``static``) and a seeded random one (``random_mix``).

``static``: every chunk is drawn with the given proportions (validated: known domains, weights >= 0,
summing to 1 within 1e-6), or uniformly over the mixed domains when none are given. The per-slot
draw (d3ray/data/mixture.py) makes a chunk's domain counts multinomial(B·L, p): over a long draw each
domain's share converges to p at rate sqrt(p(1−p)/n). RegMix trains its main run with a static mixture.

``random_mix`` (DataFlex's random mixer, ``register_mixer("random")``, which draws new random
proportions at every mixing step): a fresh mixture per *update period* of ``update_every`` chunks,
p ~ Dirichlet(concentration · 1_K), seeded by (seed, period): a pure function of the chunk id, so it
needs no state and no feedback. ``concentration`` 1 is uniform over the simplex; large values stay near
uniform, small ones near single domains.
"""

from __future__ import annotations

import numpy as np

from d3ray.schedule.mix.base import MixerBase

_RANDOM_KEY = 0x72616E64  # "rand": the random mixer's stream, apart from the stream's own draws


class StaticMixer(MixerBase):
    """The same mixture for every chunk."""

    def __init__(self, mixture: dict[str, float]) -> None:
        self.mixture = dict(mixture)

    def decide(self, chunk_id: int) -> dict[str, float]:
        return dict(self.mixture)


def random_mixture(domains: list[str], seed: int, period: int, concentration: float) -> dict[str, float]:
    """A Dirichlet(concentration · 1) mixture over ``domains``, seeded by (seed, period)."""
    rng = np.random.default_rng([seed, period, _RANDOM_KEY])
    p = rng.dirichlet(np.full(len(domains), float(concentration)))
    p = np.maximum(p, 0.0)
    p = p / p.sum()
    return {d: float(w) for d, w in zip(domains, p, strict=True)}


class RandomMixer(MixerBase):
    """A seeded random mixture per period of ``update_every`` chunks (see the module docstring)."""

    def __init__(self, domains: list[str], seed: int, update_every: int, concentration: float) -> None:
        self.domains, self.seed = list(domains), seed
        self.update_every, self.concentration = update_every, concentration

    def decide(self, chunk_id: int) -> dict[str, float]:
        return random_mixture(self.domains, self.seed, chunk_id // self.update_every, self.concentration)

    def record(self, chunk_id: int) -> dict:
        return {"mix_period": chunk_id // self.update_every}
