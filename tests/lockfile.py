"""The lock (uv.lock), read for tests that keep deployment files in step with it."""

from __future__ import annotations

import re
import tomllib
from functools import cache

from tests.conftest import REPO


@cache
def locked_versions() -> dict[str, str]:
    """Package name -> the version uv.lock holds (one per package on Linux for the pins tests read)."""
    lock = tomllib.loads((REPO / "uv.lock").read_text())
    return {p["name"]: p["version"] for p in lock["package"] if "version" in p}


def exported_pins(name: str) -> dict[str, str]:
    """Package name -> version of ``requirements/<name>`` (the lock exported for one install target)."""
    text = (REPO / "requirements" / name).read_text()
    return dict(re.findall(r"^([A-Za-z0-9._-]+)==([^\s;]+)", text, flags=re.M))
