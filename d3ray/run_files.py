"""Reading a run directory's JSONL logs (``metrics.jsonl``, ``samples.jsonl``, ``schedule_log.jsonl``).

The trainer writes them (``d3ray.train.metrics.RunLogs``); plots, benchmarks, sweeps and tests read
them. Each line is one JSON object; a missing file reads as no rows.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """All rows of a JSONL file ([] if absent)."""
    path = Path(path)
    if not path.exists():
        return []
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]
