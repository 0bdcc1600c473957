"""CI: every third-party module the package imports is declared in pyproject.toml, and every module imports.

An import that works only because another package happened to pull in its distribution (scipy
through a benchmark, say) fails on the next clean install; this check reads every ``import`` of
``d3ray/`` and ``jobs/`` (lazy ones inside functions too), maps each top-level module to the
distribution that provides it, and requires that distribution among ``[project] dependencies``, or
among an optional extra's (``[project.optional-dependencies]``, e.g. ``d3ray[wandb]``) when every
import of it is guarded: inside a function, so that importing d3ray never needs the extra (the
function's caller names the extra in a one-line error first, see ``d3ray/run/preflight.py``).
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


def declared_distributions() -> tuple[set[str], set[str]]:
    """(core distributions, distributions of optional extras)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {requirement_name(r) for r in project["dependencies"]}
    extras = {requirement_name(r) for rs in project.get("optional-dependencies", {}).values() for r in rs}
    return core, extras


def requirement_name(requirement: str) -> str:
    return normalize(re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0])


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def imported_modules(paths: list[Path]) -> dict[str, list[str]]:
    """Top-level module name → files that import it (absolute imports only)."""
    return {m: [u for u, _ in uses] for m, uses in imports_by_module(paths).items()}


def function_scoped(tree: ast.AST) -> set[int]:
    """ids of the nodes that sit inside a function body (imported only when the function runs)."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            inside.update(id(n) for n in ast.walk(node) if n is not node)
    return inside


def imports_by_module(paths: list[Path]) -> dict[str, list[tuple[str, bool]]]:
    """Top-level module name → (file, guarded: inside a function) for each import of it."""
    found: dict[str, list[tuple[str, bool]]] = {}
    for path in paths:
        tree = ast.parse(path.read_text(), filename=str(path))
        guarded = function_scoped(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], []).append((str(path.relative_to(ROOT)), id(node) in guarded))
    return found


def main() -> int:
    files = sorted((ROOT / "d3ray").rglob("*.py")) + sorted((ROOT / "jobs").rglob("*.py"))
    providers = md.packages_distributions()
    core, extras = declared_distributions()
    problems = []
    for module, uses in sorted(imports_by_module(files).items()):
        if module in sys.stdlib_module_names or module in ("d3ray", "__future__"):
            continue
        users = [u for u, _ in uses]
        dists = {normalize(d) for d in providers.get(module, [])}
        if not dists:
            problems.append(f"{module}: imported by {users[0]} but no installed distribution provides it")
        elif dists & core:
            continue
        elif not dists & extras:
            problems.append(f"{module}: imported by {users[0]}; declare one of {sorted(dists)} in pyproject.toml")
        else:
            for user, guarded in uses:
                if not guarded:
                    problems.append(f"{module}: provided by an optional extra only, but imported at module level "
                                    f"by {user}; import it inside the function that needs it")
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
