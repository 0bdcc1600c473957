"""CI: every third-party module the package imports is declared in pyproject.toml, and every module imports.

An import that works only because another package happened to pull in its distribution (scipy
through a benchmark, say) fails on the next clean install; this check reads every ``import`` of
``d3ray/`` and ``jobs/`` (lazy ones inside functions too), maps each top-level module to the
distribution that provides it, and requires that distribution among ``[project] dependencies``.
Then it imports every module of ``d3ray``, so that a module that cannot import at all is caught too.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata as md
import pkgutil
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def declared_distributions() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = set()
    for requirement in project["dependencies"]:
        names.add(normalize(re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0]))
    return names


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def imported_modules(paths: list[Path]) -> dict[str, list[str]]:
    """Top-level module name → files that import it (absolute imports only)."""
    found: dict[str, list[str]] = {}
    for path in paths:
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], []).append(str(path.relative_to(ROOT)))
    return found


def main() -> int:
    files = sorted((ROOT / "d3ray").rglob("*.py")) + sorted((ROOT / "jobs").rglob("*.py"))
    providers = md.packages_distributions()
    declared = declared_distributions()
    problems = []
    for module, users in sorted(imported_modules(files).items()):
        if module in sys.stdlib_module_names or module in ("d3ray", "__future__"):
            continue
        dists = {normalize(d) for d in providers.get(module, [])}
        if not dists:
            problems.append(f"{module}: imported by {users[0]} but no installed distribution provides it")
        elif not dists & declared:
            problems.append(f"{module}: imported by {users[0]}; declare one of {sorted(dists)} in pyproject.toml")
    import d3ray

    for info in pkgutil.walk_packages(d3ray.__path__, "d3ray."):
        if info.name.endswith("__main__"):
            continue
        try:
            importlib.import_module(info.name)
        except Exception as err:  # report every module that cannot import, then fail
            problems.append(f"{info.name}: import failed: {type(err).__name__}: {err}")
    for line in problems:
        print(f"check_imports: {line}", file=sys.stderr)
    print(f"check_imports: {len(files)} files, {'FAILED' if problems else 'ok'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
