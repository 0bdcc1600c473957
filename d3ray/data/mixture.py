"""Domain mixtures: validation for the mixers, and the seeded draw of a chunk's domains.

A mixer (static, random, DoReMi, ODM, RegMix) decides a **mixture** per chunk: domain → weight.
The chunk stream then draws the domain of each of the chunk's B x L sequence slots from it,
independently per slot (as DoReMi and RegMix sample per example, and Megatron's blended datasets
do), and takes the next sequence of that domain's own stream. Per sequence rather than per batch:
every batch then mixes domains in the chunk's proportions, so an order scheduler (D3) that reorders
the chunk's batches cannot turn a mixture into a domain curriculum, and per-domain losses still come
from the per-sample losses the trainers report.

The draw of chunk c is a pure function of (seed, c, mixture): the same weights history gives the
same samples, on any cluster, after any restart, with no RNG state in the cursor.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

MIXTURE_TOLERANCE = 1e-6
_DRAW_KEY = 0x6D6978  # "mix": keeps the draw's random stream apart from other (seed, chunk) streams


def validate_mixture(mixture: Mapping[str, float], domains: Sequence[str], field: str = "mixture") -> dict[str, float]:
    """Check a mixture and return it as a plain dict of floats (every known domain, 0.0 if absent).

    Args:
        mixture: domain → weight.
        domains: the known domains (``DataConfig.domains``).
        field: the config field or call the mixture came from, named in every error.

    Raises:
        ValueError: empty, an unknown domain, a weight that is not a finite number >= 0, or weights
            that do not sum to 1 within 1e-6.
    """
    if not isinstance(mixture, Mapping) or not mixture:
        raise ValueError(f"{field}: a mixture must be a non-empty mapping domain -> weight, got {mixture!r}")
    unknown = sorted(set(mixture) - set(domains))
    if unknown:
        raise ValueError(f"{field}: unknown domain(s) {unknown}; known domains: {list(domains)}")
    out = {}
    for domain in domains:
        weight = mixture.get(domain, 0.0)
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not math.isfinite(weight):
            raise ValueError(f"{field}.{domain}: weight must be a finite number, got {weight!r}")
        if weight < 0:
            raise ValueError(f"{field}.{domain}: weight must be >= 0, got {weight}")
        out[domain] = float(weight)
    total = math.fsum(out.values())
    if abs(total - 1.0) > MIXTURE_TOLERANCE:
        raise ValueError(f"{field}: weights must sum to 1 (within {MIXTURE_TOLERANCE:g}), they sum to {total!r}")
    return out


def require_mixable(corpus_domains: Sequence[str], field: str = "schedule.type") -> None:
    """A mixer needs at least two domains with data.

    Args:
        corpus_domains: the domains that have records in the training corpus (e.g. from
            :func:`d3ray.data.report.inspect` or the redpajama_1t folders).
        field: the config field that asked for mixing, named in the error.

    Raises:
        ValueError: fewer than two domains.
    """
    present = sorted(set(corpus_domains))
    if len(present) < 2:
        raise ValueError(
            f"{field}: a domain mixer needs a corpus of at least two domains; this corpus has "
            f"{present or 'none'}. Use an order scheduler (random, sequential, d3) instead."
        )


def draw_domains(mixture: Mapping[str, float], domains: Sequence[str], n: int, seed: int, chunk_id: int) -> list[str]:
    """The domains of a chunk's ``n`` sequence slots, drawn i.i.d. from ``mixture``.

    Deterministic in (mixture, domain order, n, seed, chunk_id). ``mixture`` should come from
    :func:`validate_mixture` (it is renormalised, so a sum off by < 1e-6 is harmless).
    """
    p = np.asarray([float(mixture.get(d, 0.0)) for d in domains], dtype=np.float64)
    p = p / p.sum()
    rng = np.random.default_rng([seed, chunk_id, _DRAW_KEY])
    picks = rng.choice(len(domains), size=n, p=p)
    return [domains[i] for i in picks]
