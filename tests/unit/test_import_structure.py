"""The import structure of d3ray (issues #30, #48): no import circle between its modules, imports that only
go down the layers the package's folders show (a module imports from its own layer or a lower one, never a
higher one), as Ray's ``test_circular_imports.py`` guards Ray's, and a product that never imports the lab.

Two parts, one door. The product, lowest first: the foundation (the root modules) → data and solvers →
model → influence → schedule → evaluation, export → train (the worker) → run (the driver) → plots, sweeps →
each stage's command. The lab (``d3ray/lab/``: compare, census, bench) sits above the whole product: it runs
and reads the product, and no product module imports it, not even lazily inside a function
(:func:`product_to_lab_report`, which has no exceptions list). The front door (``d3ray.cli``, ``d3ray.__main__``) sits above both and loads
every command, the lab's too, by name.

The graph is read from the source (``ast``), without importing anything: every ``import d3ray...`` and
``from d3ray... import ...`` (and relative import) of every ``d3ray/**/*.py``, at module level and inside
functions and methods alike (an import deferred into a function that points back at its importer is still
a circle: it only moves the failure to the first call). ``from pkg import name`` is an edge to ``pkg.name``
when that is a module, else to ``pkg``. Not edges: the implicit import of a package's ``__init__`` before its
submodules (Python orders that itself), and names looked up with ``importlib`` from strings (``d3ray.cli``'s
command table, ``d3ray.data``'s lazy attributes). Imports under ``if TYPE_CHECKING:`` never run, so they
cannot close a circle and the cycle check skips them; they are still dependencies, so the layering counts them.

The checkers are plain functions over dicts, tested on small synthetic graphs first (each check must be
able to fail).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = "d3ray"

# ---- the layers, lowest first ------------------------------------------------------------------------------
# A module belongs to the layer of the longest entry that names it or a package above it (the root package
# ``d3ray`` only by its exact name). Every package folder of d3ray/ is an entry (test_every_folder_is_a_layer).
#: The lab: instruments that study the product. The product never imports it.
LAB = "d3ray.lab"
#: The front door above the product and the lab: the ``d3ray`` command, which loads each command by name.
FRONT_DOOR = ["d3ray.cli", "d3ray.__main__"]
#: Each product stage's command-line wiring (``command.py``), above the stages.
STAGE_COMMANDS = ["d3ray.data.command", "d3ray.eval.command", "d3ray.export.command", "d3ray.plot.command",
                  "d3ray.schedule.command", "d3ray.solver.command", "d3ray.run.command", "d3ray.tune.command",
                  "d3ray.doctor"]
LAYERS: list[tuple[str, list[str]]] = [
    # errors, the config loader and the registry every stage's config uses, run-directory files, fault drills,
    # Ray object references (the ObjectRef test, the result by a deadline or the fallback)
    ("foundation", ["d3ray", "d3ray.errors", "d3ray.registry", "d3ray.config_loading", "d3ray.run_files",
                    "d3ray.faults", "d3ray.ray_refs", "d3ray.deepspeed_import", "d3ray.safe_load"]),
    # the stages that need no model: shards -> sequences (Ray Data) -> chunks, and the ordering solvers (pure math)
    ("data and solvers", ["d3ray.data", "d3ray.solver"]),
    # model presets and builder, LoRA, the per-sequence LM loss
    ("model", ["d3ray.model"]),
    # influence estimators and sketches (pure) + the InfluenceWorker, which builds a model
    ("influence", ["d3ray.influence"]),
    # schedulers, ScheduleCoordinator: data + influence + solvers + model actors
    ("schedule", ["d3ray.schedule"]),
    # the held-out evaluation harness (data only; run by the trainers during training, and by `d3ray eval`)
    ("evaluation", ["d3ray.eval"]),
    # checkpoint -> Hugging Face directory (data, LoRA and the run files only; the driver hands it to the
    # mixers' pre-runs, DoReMi's reference)
    ("export", ["d3ray.export"]),
    # the worker: Ray Train + DeepSpeed trainers (it gets the train and model configs, never the RunConfig);
    # beside it, the scheduler's work on the ranks (train/scheduling/: it takes the worker's TrainerRank
    # and collectives, and the loop builds its TrainerSide: one layer)
    ("train", ["d3ray.train", "d3ray.train.scheduling"]),
    # the run: RunConfig composes the stage configs; the driver (prepare, preflight, cluster env, the
    # coordinator and the fit) imports the worker, never the reverse
    ("run", ["d3ray.config", "d3ray.run"]),
    # after a run: run-directory plots
    ("after the run", ["d3ray.plot"]),
    # Ray Tune sweeps over whole runs
    ("sweeps", ["d3ray.tune"]),
    # each stage's subcommands, `d3ray config show`, `d3ray doctor`
    ("stage commands", ["d3ray.config_docs", *STAGE_COMMANDS]),
    # the lab: scheduler comparisons (which use sweeps and plots), census, benches, their commands, and the
    # questions they ask of a schedule config (d3ray/lab/schedule_questions.py)
    ("lab", [LAB]),
    # the command line: `d3ray`, which loads the stage commands and the lab's by name
    ("front door", FRONT_DOOR),
]
PRODUCT_LAYERS = [name for name, _ in LAYERS if name not in ("lab", "front door")]

# Imports from a lower layer to a higher one that stay, each with its reason: (importer, imported module). None.
ALLOWED_UPWARD: dict[tuple[str, str], str] = {}

# Import circles that stay, each with its reason: frozenset of the modules of the circle -> reason. None.
ALLOWED_CYCLES: dict[frozenset[str], str] = {}


# ---- the graph -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    path: str
    line: int
    in_function: bool = False
    type_only: bool = False

    def where(self) -> str:
        how = " (type only)" if self.type_only else " (in a function)" if self.in_function else ""
        return f"{self.path}:{self.line} {self.importer} imports {self.imported}{how}"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules(root: Path = REPO, package: str = PACKAGE) -> dict[str, Path]:
    """Module name -> file, for every .py file of the package."""
    return {module_name(p, root): p for p in sorted((root / package).rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _owner(name: str, modules: Iterable[str]) -> str | None:
    """The longest known module that is ``name`` or a package above it."""
    known = set(modules)
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str, source: str, path: str, modules: Iterable[str], is_package: bool = False,
               package: str = PACKAGE) -> list[Import]:
    """The imports of ``package`` modules in ``source`` (module ``module``), one per imported module and line."""
    known = set(modules)
    found: list[Import] = []

    def visit(node: ast.AST, in_function: bool, type_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, True, type_only)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    visit(ast.Module(body=[stmt], type_ignores=[]), in_function, True)
                for stmt in child.orelse:
                    visit(ast.Module(body=[stmt], type_ignores=[]), in_function, type_only)
            elif isinstance(child, (ast.Import, ast.ImportFrom)):
                for target in _targets(child):
                    if target == package or target.startswith(package + "."):
                        owner = _owner(target, known)
                        if owner and owner != module and not any(
                                i.imported == owner and i.line == child.lineno for i in found):
                            found.append(Import(module, owner, path, child.lineno, in_function, type_only))
            else:
                visit(child, in_function, type_only)

    def _targets(node: ast.Import | ast.ImportFrom) -> list[str]:
        if isinstance(node, ast.Import):
            return [alias.name for alias in node.names]
        base = node.module or ""
        if node.level:
            here = module.split(".") if is_package else module.split(".")[:-1]
            here = here[:len(here) - (node.level - 1)]
            base = ".".join(here + ([node.module] if node.module else []))
        return [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]

    visit(ast.parse(source, filename=path), False, False)
    return found


def package_imports(root: Path = REPO, package: str = PACKAGE) -> list[Import]:
    modules = package_modules(root, package)
    out: list[Import] = []
    for name, path in modules.items():
        out += imports_of(name, path.read_text(encoding="utf-8"), str(path.relative_to(root)), modules,
                          path.name == "__init__.py", package)
    return out


# ---- the checks ------------------------------------------------------------------------------------------
def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module (or a module importing itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    nodes = sorted(set(graph) | {m for targets in graph.values() for m in targets})

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, ()):
                out.append(sorted(component))

    for v in nodes:
        if v not in index:
            connect(v)
    return out


def a_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One shortest circle through the component's first module: [a, b, ..., a]."""
    start, members = component[0], set(component)
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph.get(v, ())):
                if w not in members:
                    continue
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return [start, *reversed(path[:-1]), start] if v != start else [start, start]
                if w not in parent:
                    parent[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no circle through {start} in {component}")


def cycle_report(imports: list[Import], allowed: dict[frozenset[str], str] = ALLOWED_CYCLES) -> list[str]:
    """One message per import circle not in ``allowed``, naming each import of one circle (file:line)."""
    runtime = [i for i in imports if not i.type_only]
    graph: dict[str, set[str]] = {}
    for i in runtime:
        graph.setdefault(i.importer, set()).add(i.imported)
    problems = []
    for component in strongly_connected(graph):
        if frozenset(component) in allowed:
            continue
        cycle = a_cycle(graph, component)
        steps = [next(i for i in runtime if (i.importer, i.imported) == (a, b)) for a, b in zip(cycle, cycle[1:], strict=False)]
        problems.append(f"import circle {' -> '.join(cycle)} (component: {', '.join(component)}):\n    "
                        + "\n    ".join(s.where() for s in steps))
    return problems


def layer_of(module: str, layers: list[tuple[str, list[str]]] = LAYERS, package: str = PACKAGE) -> int | None:
    best: tuple[int, int] | None = None  # (length of the entry, layer)
    for n, (_, entries) in enumerate(layers):
        for entry in entries:
            hit = module == entry or (entry != package and module.startswith(entry + "."))
            if hit and (best is None or len(entry) > best[0]):
                best = (len(entry), n)
    return None if best is None else best[1]


def upward_report(imports: list[Import], layers: list[tuple[str, list[str]]] = LAYERS,
                  allowed: dict[tuple[str, str], str] = ALLOWED_UPWARD, package: str = PACKAGE) -> list[str]:
    """One message per import from a lower layer to a higher one that ``allowed`` does not list."""
    problems = []
    for i in imports:
        src, dst = layer_of(i.importer, layers, package), layer_of(i.imported, layers, package)
        if src is None or dst is None or dst <= src or (i.importer, i.imported) in allowed:
            continue
        problems.append(f"{i.where()}: layer '{layers[src][0]}' imports from the higher layer '{layers[dst][0]}'")
    return problems


def in_package(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def product_to_lab_report(imports: list[Import], lab: str = LAB, front_door: Iterable[str] = FRONT_DOOR) -> list[str]:
    """One message per import of a lab module by a product module (any module outside ``lab`` but the front
    door), wherever it stands: at module level, inside a function, or under ``TYPE_CHECKING``. No exceptions."""
    door = set(front_door)
    return [f"{i.where()}: the product imports the lab ({lab}); the lab may import the product, never the reverse"
            for i in imports
            if in_package(i.imported, lab) and not in_package(i.importer, lab) and i.importer not in door]


# ---- the checkers themselves, on synthetic graphs ----------------------------------------------------------
def _imp(a: str, b: str, line: int = 1, **kw) -> Import:
    return Import(a, b, f"{a.replace('.', '/')}.py", line, **kw)


def test_checker_reads_module_function_type_only_and_relative_imports():
    modules = ["p", "p.a", "p.b", "p.c", "p.sub", "p.sub.d"]
    source = (
        "from __future__ import annotations\n"
        "import os\n"
        "from typing import TYPE_CHECKING\n"
        "import p.b\n"                             # 4: a module
        "from p import c, thing\n"                 # 5: a submodule (c) and a name of the package (p)
        "if TYPE_CHECKING:\n"
        "    from p.sub.d import D\n"              # 7: type only
        "def f():\n"
        "    from .sub import d\n"                 # 9: relative, in a function
        "class K:\n"
        "    def m(self):\n"
        "        import p.sub.d.nothing\n"         # 12: a name below a module: that module
    )
    got = {(i.imported, i.line, i.in_function, i.type_only) for i in imports_of("p.a", source, "p/a.py", modules,
                                                                                  package="p")}
    assert got == {("p.b", 4, False, False), ("p.c", 5, False, False), ("p", 5, False, False),
                   ("p.sub.d", 7, False, True), ("p.sub.d", 9, True, False), ("p.sub.d", 12, True, False)}


def test_checker_finds_a_two_module_circle_and_names_its_lines():
    imports = [_imp("p.a", "p.b", 3), _imp("p.b", "p.a", 7, in_function=True), _imp("p.b", "p.c", 8)]
    (problem,) = cycle_report(imports, {})
    assert "p.a -> p.b -> p.a" in problem and "p/a.py:3" in problem and "p/b.py:7" in problem
    assert cycle_report(imports, {frozenset({"p.a", "p.b"}): "reason"}) == []
    assert cycle_report([_imp("p.a", "p.b"), _imp("p.b", "p.c"), _imp("p.a", "p.c")], {}) == []  # a DAG
    assert cycle_report([_imp("p.a", "p.b"), _imp("p.b", "p.a", type_only=True)], {}) == []  # never runs
    (longer,) = cycle_report([_imp("p.a", "p.b"), _imp("p.b", "p.c"), _imp("p.c", "p.a")], {})
    assert "p.a -> p.b -> p.c -> p.a" in longer


def test_checker_finds_an_upward_import_and_places_modules_by_longest_entry():
    layers = [("low", ["p", "p.low"]), ("high", ["p.high"]), ("top", ["p.low.command"])]
    assert [layer_of(m, layers, "p") for m in ("p", "p.low.x", "p.high.y", "p.low.command", "p.other")] == [
        0, 0, 1, 2, None]
    up = _imp("p.low.x", "p.high.y", 12)
    (problem,) = upward_report([up, _imp("p.high.y", "p.low.x"), _imp("p.low.command", "p.high.y")], layers, {}, "p")
    assert problem.startswith("p/low/x.py:12 p.low.x imports p.high.y") and "'low'" in problem and "'high'" in problem
    assert upward_report([up], layers, {("p.low.x", "p.high.y"): "reason"}, "p") == []


def test_checker_finds_a_product_import_of_the_lab_at_module_level_in_a_function_and_type_only():
    modules = ["p", "p.cli", "p.train", "p.train.loop", "p.lab", "p.lab.census", "p.lab.census.worker"]
    product = (
        "from typing import TYPE_CHECKING\n"
        "from p.lab.census import worker\n"     # 2: module level
        "if TYPE_CHECKING:\n"
        "    from p.lab import census\n"        # 4: type only
        "def run():\n"
        "    from ..lab.census.worker import W\n"  # 6: lazy, relative
        "    from p import lab\n"               # 7: the lab package itself
    )
    found = imports_of("p.train.loop", product, "p/train/loop.py", modules, package="p")
    lab_side = imports_of("p.lab.census.worker", "from p.train import loop\n", "p/lab/census/worker.py", modules,
                          package="p")
    door = imports_of("p.cli", "def main():\n    import p.lab.census\n", "p/cli.py", modules, package="p")
    problems = product_to_lab_report(found + lab_side + door, "p.lab", ["p.cli"])
    assert [p.split(" ")[0] for p in problems] == ["p/train/loop.py:2", "p/train/loop.py:4", "p/train/loop.py:6",
                                                    "p/train/loop.py:7"]
    assert "(type only)" in problems[1] and "(in a function)" in problems[2]
    assert product_to_lab_report(lab_side + door, "p.lab", ["p.cli"]) == []  # lab -> product, door -> lab: fine


def test_checker_finds_a_product_import_of_the_lab_in_files_on_disk(tmp_path):
    for name, source in {"p/__init__.py": "", "p/cli.py": "import importlib\n",
                         "p/train/__init__.py": "", "p/train/loop.py": "def f():\n    import p.lab.bench.step\n",
                         "p/lab/__init__.py": "", "p/lab/bench/__init__.py": "",
                         "p/lab/bench/step.py": "from p.train import loop\n"}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(source)
    (problem,) = product_to_lab_report(package_imports(tmp_path, "p"), "p.lab", ["p.cli"])
    assert problem.startswith("p/train/loop.py:2 p.train.loop imports p.lab.bench.step (in a function)")
    (tmp_path / "p/train/loop.py").write_text("def f():\n    return 1\n")
    assert product_to_lab_report(package_imports(tmp_path, "p"), "p.lab", ["p.cli"]) == []


# ---- the checks on d3ray ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def imports() -> list[Import]:
    return package_imports()


def test_no_import_circle_between_d3ray_modules(imports):
    problems = cycle_report(imports)
    assert not problems, "\n".join(problems)


def test_every_d3ray_module_has_a_layer():
    missing = [m for m in package_modules() if layer_of(m) is None]
    assert not missing, f"modules in no layer (add them to LAYERS in this file): {missing}"


def test_d3ray_imports_go_down_the_layers(imports):
    problems = upward_report(imports)
    assert not problems, "\n".join(problems)


def test_allowed_exceptions_are_still_needed(imports):
    """An exception that no import needs any more is removed from the list (keep the lists short)."""
    edges = {(i.importer, i.imported) for i in imports}
    assert set(ALLOWED_UPWARD) <= edges, set(ALLOWED_UPWARD) - edges
    runtime: dict[str, set[str]] = {}
    for i in imports:
        if not i.type_only:
            runtime.setdefault(i.importer, set()).add(i.imported)
    assert set(ALLOWED_CYCLES) <= {frozenset(c) for c in strongly_connected(runtime)}
    assert all(layer_of(a) is not None and layer_of(b) is not None and layer_of(a) < layer_of(b)
               for a, b in ALLOWED_UPWARD)


def test_the_product_never_imports_the_lab(imports):
    problems = product_to_lab_report(imports)
    assert not problems, "\n".join(problems)


def test_every_folder_is_a_layer_and_the_lab_sits_above_the_product():
    """Each package folder of d3ray/ (and d3ray/lab/'s) is named by the layers, the lab above every product
    layer and below the front door only."""
    entries = {entry for _, layer in LAYERS for entry in layer}
    folders = {module_name(p.parent / "__init__.py", REPO) for p in (REPO / PACKAGE).glob("*/__init__.py")}
    assert folders - entries == set(), f"package folders in no layer (add them to LAYERS): {folders - entries}"
    lab = layer_of(LAB)
    assert all(layer_of(f"{LAB}.{p.parent.name}") == lab for p in (REPO / PACKAGE / "lab").glob("*/__init__.py"))
    assert lab == len(PRODUCT_LAYERS) and [name for name, _ in LAYERS[lab:]] == ["lab", "front door"]


def test_the_driver_and_the_run_config_sit_above_the_worker_and_the_model_below():
    """The driver (d3ray/run/) imports the worker, whose function Ray Train ships by reference, never the
    reverse; the worker gets the train and model configs, not the RunConfig; the scheduler's work on the
    ranks (d3ray/train/scheduling/) is the worker's layer; the model sits below influence and the worker."""
    worker = layer_of("d3ray.train.loop")
    assert layer_of("d3ray.train.scheduling.trainer_side") == worker
    assert layer_of("d3ray.run.pretrain") > worker and layer_of("d3ray.config") > worker
    assert layer_of("d3ray.model.causal_lm") < layer_of("d3ray.influence.worker") < worker
