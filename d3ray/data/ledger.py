"""Account for every record read: good and bad counts per shard, the first bad line numbers per reason,
and the stop when too large a fraction is bad.

    iter_documents (records.py) ──► Document, good or bad ──► BadRecordLedger.record / record_good / record_bad
        ──► check(max_bad_fraction): BadRecordFractionError naming the worst shard
        ──► to_dict / merge: JSON-safe counts for checkpoints, reports, other read tasks and processes

:class:`BadRecordLedger` counts bad records per shard and per reason, keeps the first line (row)
numbers of each, and stops a run whose bad fraction is too high. A later epoch reads the same lines
again: their line numbers are kept once.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Any

from d3ray.errors import UserError

if TYPE_CHECKING:
    from d3ray.data.records import Document

logger = logging.getLogger(__name__)


class BadRecordFractionError(UserError, RuntimeError):
    """Too large a fraction of the records read are bad; the message names the worst shard."""


class BadRecordLedger:
    """Counts of good and bad records per shard, with the first bad line numbers per reason.

    Args:
        keep_lines: how many line numbers to keep per (shard, reason).
        log_first: how many bad records to log one by one (the rest only in :meth:`log_summary`).
    """

    def __init__(self, keep_lines: int = 10, log_first: int = 10) -> None:
        self.keep_lines = keep_lines
        self.log_first = log_first
        self.good: Counter[str] = Counter()  # shard -> good records
        self.bad: dict[str, Counter[str]] = defaultdict(Counter)  # shard -> reason -> count
        self.first_lines: dict[tuple[str, str], list[int]] = defaultdict(list)  # (shard, reason) -> distinct lines
        self._logged = 0

    def record_good(self, shard: str, count: int = 1) -> None:
        self.good[shard] += count

    def record_bad(self, shard: str, line: int, reason: str, detail: str = "") -> None:
        self.bad[shard][reason] += 1
        lines = self.first_lines[(shard, reason)]
        if len(lines) < self.keep_lines and line not in lines:  # a later epoch reads the same lines again
            lines.append(line)
        if self._logged < self.log_first:
            self._logged += 1
            logger.warning("bad record %s line %d: %s (%s)", shard, line, reason, detail)

    def record(self, doc: Document) -> None:
        """Count one document, good or bad."""
        if doc.is_bad:
            self.record_bad(doc.shard, doc.line, doc.bad_reason, doc.detail)
        else:
            self.record_good(doc.shard)

    @property
    def total_good(self) -> int:
        return sum(self.good.values())

    @property
    def total_bad(self) -> int:
        return sum(sum(c.values()) for c in self.bad.values())

    @property
    def total(self) -> int:
        return self.total_good + self.total_bad

    @property
    def bad_fraction(self) -> float:
        return self.total_bad / self.total if self.total else 0.0

    def bad_by_reason(self) -> dict[str, int]:
        out: Counter[str] = Counter()
        for counts in self.bad.values():
            out.update(counts)
        return dict(sorted(out.items()))

    def worst_shard(self) -> str | None:
        """The shard with the highest bad fraction (ties: more bad records, then name)."""
        if not self.bad:
            return None

        def key(shard: str) -> tuple[float, int, str]:
            n_bad = sum(self.bad[shard].values())
            return (-n_bad / (n_bad + self.good[shard]), -n_bad, shard)

        return min((s for s in self.bad if sum(self.bad[s].values())), key=key, default=None)

    def describe_shard(self, shard: str) -> str:
        n_bad = sum(self.bad[shard].values())
        parts = [
            f"{reason} x{count} (first lines {self.first_lines[(shard, reason)]})"
            for reason, count in sorted(self.bad[shard].items())
        ]
        return f"{shard}: {n_bad} bad of {n_bad + self.good[shard]} records: " + ", ".join(parts)

    def check(self, max_bad_fraction: float, field: str = "data.max_bad_fraction") -> None:
        """Raise :class:`BadRecordFractionError` if the bad fraction exceeds ``max_bad_fraction`` (the config
        ``field`` that sets it, named in the message)."""
        if self.bad_fraction > max_bad_fraction:
            worst = self.worst_shard()
            raise BadRecordFractionError(
                f"{self.total_bad} of {self.total} records are bad ({self.bad_fraction:.2%} > "
                f"max_bad_fraction {max_bad_fraction:.2%}); by reason {self.bad_by_reason()}; "
                f"worst file {self.describe_shard(worst) if worst else '-'}; fix or remove those records, or "
                f"allow more with --{field}"
            )

    def log_summary(self) -> None:
        """Log totals, then one line per shard with bad records."""
        logger.info(
            "records: %d good, %d bad (%.3f%%) %s",
            self.total_good,
            self.total_bad,
            100 * self.bad_fraction,
            self.bad_by_reason() or "",
        )
        for shard in sorted(self.bad):
            logger.warning("bad records in %s", self.describe_shard(shard))

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-safe state (for checkpoints, reports and :meth:`merge`)."""
        return {
            "good": dict(sorted(self.good.items())),
            "bad": {shard: dict(sorted(c.items())) for shard, c in sorted(self.bad.items())},
            "first_lines": {f"{s}\t{r}": lines for (s, r), lines in sorted(self.first_lines.items())},
            "total_good": self.total_good,
            "total_bad": self.total_bad,
            "bad_fraction": self.bad_fraction,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], keep_lines: int = 10, log_first: int = 10) -> BadRecordLedger:
        ledger = cls(keep_lines=keep_lines, log_first=log_first)
        ledger.merge(data)
        return ledger

    def merge(self, other: BadRecordLedger | dict[str, Any]) -> None:
        """Add another ledger's counts (e.g. from another read task or process) into this one."""
        data = other.to_dict() if isinstance(other, BadRecordLedger) else other
        self.good.update(data["good"])
        for shard, counts in data["bad"].items():
            self.bad[shard].update(counts)
        for key, lines in data["first_lines"].items():
            shard, reason = key.split("\t", 1)
            kept = self.first_lines[(shard, reason)]
            kept[:] = sorted(set(kept) | set(lines))[: self.keep_lines]



def check_ledger(counts: dict[str, Any], max_bad_fraction: float, field: str = "data.max_bad_fraction") -> None:
    """:meth:`BadRecordLedger.check` on a ledger's ``to_dict`` (a run's report): what the run read, at its end.

    Raises:
        BadRecordFractionError: over the limit; the message says it counts every record the run read.
    """
    ledger = BadRecordLedger.from_dict(counts, log_first=0)
    try:
        ledger.check(max_bad_fraction, field)
    except BadRecordFractionError as err:
        raise BadRecordFractionError(f"the records the run read: {err}") from None
