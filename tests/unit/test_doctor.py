"""``d3ray doctor``: versions against d3ray's declared ranges, the extras by name, the table and its exit status."""

from __future__ import annotations

import subprocess
import sys

from packaging.requirements import Requirement

from d3ray.doctor import (
    EXTRAS,
    Row,
    declared_requirements,
    environment_rows,
    in_range,
    missing_core,
    render,
    requirement_row,
)


def test_in_range_ignores_a_local_build_tag_and_holds_the_bounds():
    assert in_range("2.13.0+cpu", Requirement("torch>=2.4"))
    assert in_range("2.13.0+cpu", Requirement("torch==2.13.0"))
    assert in_range("2.61.3", Requirement("ray>=2.60,<2.62"))
    assert not in_range("2.59.0", Requirement("ray>=2.60,<2.62"))
    assert not in_range("2.62.0", Requirement("ray>=2.60,<2.62"))
    assert not in_range("not a version", Requirement("ray>=2.60"))


def test_declared_requirements_split_core_from_each_extra():
    core, extras = declared_requirements()
    core_names = {r.name for r in core}
    assert {"torch", "ray", "deepspeed", "transformers", "lm-eval", "packaging"} <= core_names
    assert "pytest" not in core_names and "s3fs" not in core_names
    assert {r.name for r in extras["cloud"]} == {"s3fs", "gcsfs"}
    assert "pytest" in {r.name for r in extras["dev"]}
    assert "d3ray" not in {r.name for rs in extras.values() for r in rs}  # dev's d3ray[cloud] is not a package row
    assert set(EXTRAS) <= set(extras)  # every extra the table names is declared in pyproject.toml


def test_requirement_row_names_what_is_missing_and_the_install_line():
    missing = requirement_row(Requirement("surely-not-installed-d3ray-dep>=1"), "nothing")
    assert not missing.ok and missing.found == "missing" and "./setup.sh" in missing.fix
    out_of_range = requirement_row(Requirement("pytest<1"), "tests")
    assert not out_of_range.ok and "outside d3ray's <1" in out_of_range.found


def test_missing_core_counts_core_rows_only():
    rows = [Row("torch", True, "2.13.0", "x"), Row("d3ray[flash]", False, "missing", "y", "pip", core=False)]
    assert missing_core(rows) == []
    assert missing_core([*rows, Row("ray", False, "missing", "z", "./setup.sh")]) == ["ray"]
    text = render([*rows, Row("ray", False, "missing", "z", "./setup.sh")])
    assert "MISSING" in text and "to get ray: ./setup.sh" in text and "to get d3ray[flash]: pip" in text


def test_doctor_on_this_environment_reports_torch_ray_deepspeed_and_exits_zero():
    rows = {r.name: r for r in environment_rows()}
    assert rows["python"].ok and rows["torch"].ok and rows["ray"].ok and rows["deepspeed"].ok
    assert "CPU build" in rows["torch"].found or "CUDA" in rows["torch"].found
    assert rows["ray dashboard"].ok  # the dev set installs ray[default]
    assert "accelerator" in rows["deepspeed"].found
    assert rows["d3ray[cloud]"].ok and rows["d3ray[wandb]"].ok  # the dev set installs every extra but flash
    done = subprocess.run([sys.executable, "-m", "d3ray", "doctor"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].startswith("python")
