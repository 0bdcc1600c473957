"""cluster.yaml (AWS) and cluster-gcp.yaml pass Ray's own launcher schema offline, and keep d3ray's
invariants: a head with no CPUs, GPU workers, CPU workers with the solver custom resource, every
setup/start command list spelled out (no provider default merged in), Ray pinned to the installed
2.60 on every node, d3ray installed from the repository, and a comment on every field.

``prepare_config``/``validate_config`` are Ray private API (ray.autoscaler._private.util), pinned
with Ray itself (pyproject: ray >=2.60,<2.61).
"""

from __future__ import annotations

import re

import pytest
import ray
import yaml

from tests.conftest import REPO

FILES = ["cluster.yaml", "cluster-gcp.yaml"]
COMMAND_LISTS = (
    "initialization_commands",
    "setup_commands",
    "head_setup_commands",
    "worker_setup_commands",
    "head_start_ray_commands",
    "worker_start_ray_commands",
)
KEY_LINE = re.compile(r"^\s*(- )?(\"[^\"]+\"|[\w.~/-]+):(\s|$)")


def load(name: str) -> tuple[str, dict]:
    text = (REPO / name).read_text()
    return text, yaml.safe_load(text)


@pytest.mark.parametrize("name", FILES)
def test_cluster_yaml_ray_schema_validates_offline(name):
    from ray.autoscaler._private.util import prepare_config, validate_config

    _, raw = load(name)
    prepared = prepare_config(raw)
    validate_config(prepared)  # raises on schema errors (typos, float resources, unknown head type)
    assert prepared["available_node_types"][prepared["head_node_type"]]["max_workers"] == 0


@pytest.mark.parametrize("name", FILES)
def test_cluster_yaml_node_types_head_idle_gpu_workers_solver_resource(name):
    _, raw = load(name)
    types = raw["available_node_types"]
    head = types[raw["head_node_type"]]
    assert head["resources"] == {"CPU": 0}, "no work may be scheduled on the head"
    workers = [t for n, t in types.items() if n != raw["head_node_type"]]
    gpu = [t for t in workers if t["resources"].get("GPU", 0) >= 1]
    solver = [t for t in workers if t["resources"].get("solver_node", 0) >= 1]
    assert gpu and solver
    assert all(t["resources"].get("GPU", 0) == 0 and t["resources"]["CPU"] >= 1 for t in solver)
    assert all(t["resources"].get("gpu_node", 0) >= 1 for t in gpu), "influence actors can pin to GPU nodes"
    assert sum(t["max_workers"] for t in workers) <= raw["max_workers"]


@pytest.mark.parametrize("name", FILES)
def test_cluster_yaml_commands_explicit_and_no_provider_default_merged(name):
    from ray.autoscaler._private.util import prepare_config

    _, raw = load(name)
    prepared = prepare_config(raw)
    for key in COMMAND_LISTS:
        assert key in raw, f"{key} must be set: an omitted list silently becomes Ray's provider default"
        merged = raw["setup_commands"] if key in ("head_setup_commands", "worker_setup_commands") else []
        assert prepared[key] == merged + raw[key]  # Ray prepends the common setup to head/worker setup
    assert raw["head_start_ray_commands"] and raw["worker_start_ray_commands"]
    commands = " ".join(str(c) for key in COMMAND_LISTS for c in raw[key])
    assert "ray-wheels" not in commands and "dev0" not in commands, "no nightly Ray wheel"


@pytest.mark.parametrize("name", FILES)
def test_cluster_yaml_pins_installed_ray_and_installs_d3ray_everywhere(name):
    _, raw = load(name)
    setup = " ".join(raw["setup_commands"])  # setup_commands run on every node, head and workers
    pins = re.findall(r'"ray\[[\w,]+\]==([\d.]+)"', setup)
    assert pins == [ray.__version__], "the cluster runs the Ray this project is tested with"
    assert {"default", "train", "tune", "data"} <= set(
        re.search(r'"ray\[([\w,]+)\]', setup).group(1).split(",")
    )
    assert raw["file_mounts"]["~/d3ray"] == "."
    assert re.search(r"pip install .*-e ~/d3ray", setup)
    assert "ray start --head" in " ".join(raw["head_start_ray_commands"])
    assert "--address=$RAY_HEAD_IP:6379" in " ".join(raw["worker_start_ray_commands"])


@pytest.mark.parametrize("name", FILES)
def test_cluster_yaml_every_field_commented(name):
    text, _ = load(name)
    lines = text.splitlines()
    missing = []
    for i, line in enumerate(lines):
        if not KEY_LINE.match(line) or line.lstrip().startswith("#"):
            continue
        previous = next((p.strip() for p in reversed(lines[:i]) if p.strip()), "")
        if "#" not in line and not previous.startswith("#"):
            missing.append(f"{i + 1}: {line.strip()}")
    assert not missing, "fields without a comment:\n" + "\n".join(missing)
