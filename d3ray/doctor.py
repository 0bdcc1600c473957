"""``d3ray doctor``: what this Python environment can run, as one table, and how to install what is missing.

    d3ray doctor          # exit 0: every core piece is there; 1: one is missing or outside d3ray's range

Rows: Python; torch (its CUDA build or CPU, the GPUs it sees); Ray and whether its dashboard's
dependencies import (Ray refuses ``include_dashboard=True`` without them, and Train V2 needs the
dashboard to free a stopped trial's placement group: ``docs/design/ray.md`` §1); DeepSpeed
and which of its ops are prebuilt, JIT-built in torch's extension cache, or buildable here;
transformers and lm-eval; every other core requirement against the range d3ray declares; then each
optional extra (cloud, wandb, mlflow, regmix, flash) with the feature it enables. A missing piece's row
gives the line that installs it (from the lock where the lock covers it: ``./setup.sh``).

Versions and ranges come from the installed packages' metadata and d3ray's own declared requirements
(``importlib.metadata``), so the table says what *this* environment holds, not what a file hopes for.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import importlib.util
import os
import platform
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import InvalidVersion, Version

SETUP = "./setup.sh"  # installs the lock's pins; --dev adds every extra but flash
#: optional extras: the feature each enables and the module that proves it (distribution -> module)
EXTRAS = {
    "cloud": ("s3:// and gs:// data paths (fsspec filesystems)", {"s3fs": "s3fs", "gcsfs": "gcsfs"}),
    "wandb": ("train.report_to: [wandb]", {"wandb": "wandb"}),
    "mlflow": ("train.report_to: [mlflow]", {"mlflow-skinny": "mlflow"}),
    "regmix": ("schedule.regressor: lightgbm (RegMix's paper regressor)", {"lightgbm": "lightgbm"}),
    "flash": ("model.attn_implementation: flash_attention_2 (GPU nodes)", {"flash-attn": "flash_attn"}),
}
#: core requirements with a row of their own (details beyond the version), in table order
FEATURED = ("torch", "ray", "deepspeed", "transformers", "lm-eval")


@dataclass(frozen=True)
class Row:
    """One line of the table."""

    name: str
    ok: bool
    found: str  # the version and details, or "missing"
    enables: str
    fix: str = ""  # the install line, where not ok
    core: bool = True


def declared_requirements(dist: str = "d3ray") -> tuple[list[Requirement], dict[str, list[Requirement]]]:
    """d3ray's declared requirements: (core, extra name -> its requirements), from the installed metadata."""
    core: list[Requirement] = []
    extras: dict[str, list[Requirement]] = {}
    names = md.metadata(dist).get_all("Provides-Extra") or []
    for line in md.requires(dist) or []:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            core.append(req)
            continue
        extra = next((e for e in names if req.marker.evaluate({"extra": e})), None)
        if extra is not None and req.name != dist:  # dev's "d3ray[cloud]" is an extra of an extra
            extras.setdefault(extra, []).append(req)
    return core, extras


def installed_version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def in_range(version: str, req: Requirement) -> bool:
    """Whether ``version`` satisfies the requirement's range (a local build tag, ``+cpu``, is ignored)."""
    try:
        return req.specifier.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def requirement_row(req: Requirement, enables: str, details: str = "") -> Row:
    version = installed_version(req.name)
    fix = f"{SETUP} (installs {req.name} at the lock's version)"
    if version is None:
        return Row(req.name, False, "missing", enables, fix)
    found = version + (f" ({details})" if details else "")
    if not in_range(version, req):
        return Row(req.name, False, f"{found}: outside d3ray's {req.specifier}", enables, fix)
    return Row(req.name, True, found, enables)


def torch_details() -> str:
    import torch

    if torch.version.cuda is None:
        return "CPU build"
    return f"CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPU(s) seen"


def ray_dashboard_row() -> Row:
    from ray._private.utils import get_dashboard_dependency_error

    error = get_dashboard_dependency_error()
    if error is None:
        return Row("ray dashboard", True, "its dependencies import", "ray job submit, Train V2's clean-up of stopped trials")
    return Row("ray dashboard", False, f"does not import: {error}", "ray job submit, Train V2's clean-up of stopped trials",
               f"{SETUP} (ray[default] at the lock's version)")


def deepspeed_ops() -> str:
    """DeepSpeed's ops on this accelerator: prebuilt into the wheel, JIT-built in torch's extension cache,
    or buildable here (its compatibility probe)."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu" if not _cuda_available() else "cuda")
    from d3ray.deepspeed_import import import_deepspeed

    import_deepspeed()
    from deepspeed.accelerator import get_accelerator
    from deepspeed.git_version_info import installed_ops
    from deepspeed.ops.op_builder.all_ops import ALL_OPS
    from torch.utils.cpp_extension import get_default_build_root

    cache = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root())
    prebuilt, cached, buildable = [], [], []
    for name, builder in ALL_OPS.items():
        if builder is None or "not_implemented" in name:
            continue
        if installed_ops.get(name, False):
            prebuilt.append(name)
        elif any(cache.glob(f"{builder.name}/*.so")) or any(cache.glob(f"*/{builder.name}/*.so")):
            cached.append(name)
        elif builder.is_compatible(False):
            buildable.append(name)
    parts = [f"accelerator {get_accelerator()._name}"]
    for label, names in (("prebuilt", prebuilt), ("JIT-built", cached), ("buildable", buildable)):
        if names:
            parts.append(f"{label}: {', '.join(sorted(names))}")
    return "; ".join(parts)


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def extra_rows(extras: dict[str, list[Requirement]]) -> Iterable[Row]:
    for extra, (enables, modules) in EXTRAS.items():
        missing, found = [], []
        for req in extras.get(extra, []):
            version = installed_version(req.name)
            module = modules.get(req.name, req.name.replace("-", "_"))
            if version is None or importlib.util.find_spec(module) is None:
                missing.append(req.name)
            else:
                found.append(f"{req.name} {version}")
        fix = "" if not missing else (
            f"pip install -e '.[{extra}]' (GPU nodes, builds against torch)" if extra == "flash"
            else f"{SETUP} --dev (every extra at the lock's version), or pip install -e '.[{extra}]'")
        yield Row(f"d3ray[{extra}]", not missing, ", ".join(found) if not missing else f"missing: {', '.join(missing)}",
                  enables, fix, core=False)


def environment_rows() -> list[Row]:
    """Every row of the table, core pieces first."""
    py_ok = sys.version_info >= (3, 11)
    rows = [Row("python", py_ok, f"{platform.python_version()} ({sys.executable})", "d3ray needs >= 3.11",
                "" if py_ok else "a Python >= 3.11 (PYTHON=python3.11 ./setup.sh)")]
    core, extras = declared_requirements()
    by_name = {req.name: req for req in core}
    enables = {
        "torch": "the model, the trainers, influence",
        "ray": "the pipeline: Ray Data, Train, Tune, the actors",
        "deepspeed": "the trainers' engines (ZeRO 0-3)",
        "transformers": "models and tokenizers",
        "lm-eval": "d3ray finetune's default scoring, d3ray eval",
    }
    for name in FEATURED:
        req = by_name[name]
        row = requirement_row(req, enables[name])
        if row.ok and name == "torch":
            row = requirement_row(req, enables[name], torch_details())
        if row.ok and name == "deepspeed":
            row = requirement_row(req, enables[name], deepspeed_ops())
        rows.append(row)
        if name == "ray" and row.ok:
            rows.append(ray_dashboard_row())
    others = [requirement_row(req, "core requirement") for name, req in sorted(by_name.items()) if name not in FEATURED]
    rows.extend(r for r in others if not r.ok)
    ok_others = [r for r in others if r.ok]
    if ok_others:
        rows.append(Row(f"{len(ok_others)} other core packages", True, "in d3ray's ranges",
                        ", ".join(r.name for r in ok_others)))
    rows.extend(extra_rows(extras))
    return rows


def render(rows: list[Row]) -> str:
    """The table: one line a row, then the fixes of what is missing."""
    width = max(len(r.name) for r in rows)
    lines = []
    for r in rows:
        mark = "ok" if r.ok else ("MISSING" if r.core else "absent")
        lines.append(f"{r.name:<{width}}  {mark:<7}  {r.found}  [{r.enables}]")
    fixes = [r for r in rows if not r.ok and r.fix]
    if fixes:
        lines.append("")
        lines.extend(f"to get {r.name}: {r.fix}" for r in fixes)
    return "\n".join(lines)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="what this environment can run: Python, torch/CUDA, Ray (+dashboard), DeepSpeed ops, extras",
        description=__doc__.split("\n\n")[0],
    )
    parser.set_defaults(func=run)


def missing_core(rows: list[Row]) -> list[str]:
    """The core pieces that are missing or outside d3ray's range: a non-empty list is exit status 1."""
    return [r.name for r in rows if r.core and not r.ok]


def run(args: argparse.Namespace) -> int:
    rows = environment_rows()
    print(render(rows))
    missing = missing_core(rows)
    if missing:
        print(f"\nd3ray doctor: core pieces missing or out of range: {', '.join(missing)}", file=sys.stderr)
        return 1
    return 0

