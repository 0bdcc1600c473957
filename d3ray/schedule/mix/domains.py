"""The domains a mixer mixes, resolved and checked in the driver before Ray starts.

    schedule.domains (or every known domain with records) ∩ what a quick read of the corpus finds
        (SFT: the known domains are the ``task`` values of the training files, sorted; a full read)
        ─► at least two (a mixer on a one-domain corpus is an error naming ``schedule.type``)
        ─► ``schedule.weights`` (static) / ``schedule.reference_mixture`` (DoReMi) checked against them

The probe reads records from the start of the shards until it has seen ``max_records`` (default
50,000) or the whole corpus: a small corpus is read whole, so a domain it lacks is known to be missing;
on a large corpus a domain not seen in the probe is only missing from its first records (a weight on it
is accepted, and a domain with no data at all fails when its stream is first drawn from, naming it).
Everything raised here is a :class:`~d3ray.config_loading.ConfigError` naming the field.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from typing import Any

from d3ray.config_loading import ConfigError

logger = logging.getLogger(__name__)


def probe_domains(shards: Sequence[Any], data: Any, max_records: int = 50_000) -> tuple[Counter, bool]:
    """Good records per known domain in the first ``max_records`` records; and whether that was all of them."""
    from d3ray.data.records import iter_documents

    counts: Counter = Counter()
    seen = 0
    for shard in shards:
        for doc in iter_documents(shard, data.layout, data.domains, data.max_record_bytes, text_key=data.text_key,
                                  domain_key=data.domain_key):
            seen += 1
            if not doc.is_bad:
                counts[doc.domain] += 1
            if seen >= max_records:
                return counts, False
    return counts, True


def resolve_mix_domains(schedule: Any, data: Any, shards: Sequence[Any], sft: Any = None,
                        max_records: int = 50_000) -> list[str]:
    """The domains ``schedule`` (a mix config) mixes: in ``data.domains`` order, or for SFT (``sft``, an
    :class:`~d3ray.data.sft.SftDataConfig` with its paths resolved) the tasks of ``sft.paths``, sorted.

    Raises:
        ConfigError: an unknown domain in ``schedule.domains`` or in the given weights, fewer than two
            domains to mix, or a weight on a domain the corpus lacks.
    """
    if sft:  # SFT: the tasks are the domains; a full read of the (small) files, no tokenizing
        from d3ray.data.sft_sequences import sft_task_counts

        counts, complete = Counter(sft_task_counts(sft)), True
        known = list(counts)
        where = f"known domains (the tasks of sft.paths): {known}"
        logger.info("mixing: the SFT tasks of %s: %s", list(sft.paths), dict(counts))
    else:
        known = list(data.domains)
        where = f"known domains (data.domains): {known}"
    unknown = [d for d in schedule.domains if d not in known]
    if unknown:
        raise ConfigError(f"schedule.domains: unknown domain(s) {unknown}; {where}")
    weights = schedule.given_weights()
    weight_field = "schedule.weights" if schedule.type_name == "static" else "schedule.reference_mixture"
    unknown = sorted(set(weights) - set(known))
    if unknown:
        raise ConfigError(f"{weight_field}: unknown domain(s) {unknown}; {where}")
    from d3ray.data.mixture import require_mixable

    try:
        require_mixable(known, "schedule.type")
    except ValueError as err:
        raise ConfigError(f"{err} ({where})") from None
    if not sft:
        counts, complete = probe_domains(shards, data, max_records)
        logger.info("mixing: the corpus probe (%s) found %s",
                    "whole corpus" if complete else f"first {max_records} records", dict(counts))
    found = [d for d in known if counts.get(d)]
    if schedule.domains:
        domains = [d for d in known if d in schedule.domains]
        missing = [d for d in domains if not counts.get(d)]
        if missing and complete:
            raise ConfigError(f"schedule.domains: the corpus has no records of {missing} (it has {found})")
        field_name = "schedule.domains"
    else:
        domains = [d for d in known if counts.get(d) or (not complete and weights.get(d, 0) > 0)]
        field_name = "schedule.type"
    for d, w in weights.items():
        if w > 0 and d not in domains:
            reason = "the corpus has no records of it" if complete and not counts.get(d) else "it is not in schedule.domains"
            raise ConfigError(f"{weight_field}.{d}: weight {w} on a domain that is not mixed ({reason}); mixed: {domains}")
    try:
        require_mixable(domains, field_name)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    return domains
