"""cluster.yaml (AWS) and cluster-gcp.yaml pass Ray's own launcher schema offline, and keep d3ray's
invariants: a head with no CPUs, GPU workers, CPU workers with the solver custom resource, every
setup/start command list spelled out (no provider default merged in), every node installing the lock
(requirements/node.txt: the installed Ray 2.60 and the cloud extra) and d3ray from the repository,
torch pinned to the lock's version in the CUDA build the GPU image's driver runs, the AWS node configs valid ``RunInstances`` arguments (botocore's own
EC2 model, offline) with instance profiles for S3, GCP GPU nodes with a ``scheduling`` mapping, and a
comment on every field.

``prepare_config``/``validate_config`` are Ray private API (ray.autoscaler._private.util), pinned
with Ray itself (pyproject: ray >=2.60,<2.61).
"""

from __future__ import annotations

import re

import pytest
import ray
import yaml

from tests.conftest import REPO
from tests.lockfile import exported_pins, locked_versions

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
def test_cluster_yaml_installs_the_lock_and_d3ray_everywhere(name):
    _, raw = load(name)
    setup = " ".join(raw["setup_commands"])  # setup_commands run on every node, head and workers
    assert re.search(r'pip install .*-r "\$HOME/d3ray/requirements/node.txt"', setup), "the lock, exported"
    assert re.search(r'pip install .*--no-deps -e "\$HOME/d3ray"', setup), "d3ray itself, nothing re-resolved"
    assert re.findall(r'"([\w\[\],.-]+)==', setup) == ["torch"], "no second, hand-kept pin list"
    node = exported_pins("node.txt")
    assert node["ray"] == ray.__version__, "the cluster runs the Ray this project is tested with"
    # ray[default] (dashboard, job submission), the cloud extra (s3:// gs:// data), DeepSpeed, at the lock's pins
    for package in ("aiohttp", "opencensus", "s3fs", "gcsfs", "deepspeed", "transformers"):
        assert node[package] == locked_versions()[package]
    assert "torch" not in node and not any(p.startswith("nvidia-") for p in node), "torch comes from the CUDA 12.8 index"
    assert raw["file_mounts"]["~/d3ray"] == "."
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


CUDA_INDEX = re.compile(r'"torch==([\d.]+)" --index-url https://download.pytorch.org/whl/cu(\d+)')


@pytest.mark.parametrize("name", FILES)
def test_cluster_yaml_torch_cuda_build_pinned_before_everything_else(name):
    import torch

    _, raw = load(name)
    setup = raw["setup_commands"]
    pinned = [(i, CUDA_INDEX.search(c)) for i, c in enumerate(setup) if CUDA_INDEX.search(c)]
    assert len(pinned) == 1, "one torch install, from PyTorch's CUDA index"
    index, match = pinned[0]
    assert match.group(1) == torch.__version__.split("+")[0] == locked_versions()["torch"], "the lock's torch"
    assert match.group(2) == "128", "CUDA 12.8: driver >= 570, what the GPU images ship"
    later = [c for c in setup[index + 1:] if "pip install" in c]
    assert later and all("torch" not in c for c in later), "nothing after it installs another torch"


def test_cluster_yaml_gcp_gpu_image_matches_torch_cuda_and_scheduling_is_a_mapping():
    _, raw = load("cluster-gcp.yaml")
    gpu = [t["node_config"] for t in raw["available_node_types"].values() if t["resources"].get("GPU", 0) >= 1]
    assert gpu
    for node in gpu:
        # instances.insert takes a Scheduling object; a list is rejected by the Compute API
        assert node["scheduling"] == {"onHostMaintenance": "TERMINATE", "automaticRestart": True}
        image = node["disks"][0]["initializeParams"]["sourceImage"]
        assert "common-cu128" in image and "nvidia-570" in image, "CUDA 12.8 image with the 570 driver"


def test_cluster_yaml_aws_node_configs_valid_run_instances_with_s3_profiles():
    """Each node_config is what Ray's AWS provider passes to ``ec2.create_instances`` (plus the counts and
    tags it adds): checked against botocore's bundled EC2 model, which knows every RunInstances field."""
    import botocore.session
    from botocore.validate import ParamValidator

    text, raw = load("cluster.yaml")
    shape = botocore.session.get_session().get_service_model("ec2").operation_model("RunInstances").input_shape
    profiles = {}
    for node_type, spec in raw["available_node_types"].items():
        report = ParamValidator().validate({**spec["node_config"], "MinCount": 1, "MaxCount": 1}, shape)
        assert not report.has_errors(), f"{node_type}: {report.generate_report()}"
        profiles[node_type] = spec["node_config"]["IamInstanceProfile"]["Name"]
    head = raw["head_node_type"]
    assert profiles[head] == "d3ray-head"  # set explicitly, Ray creates no default role (and none for workers)
    assert {p for n, p in profiles.items() if n != head} == {"d3ray-worker"}
    for action in ("s3:ListBucket", "s3:GetObject", "s3:PutObject", "AmazonEC2FullAccess", "iam:PassRole"):
        assert action in text, f"the policy the profiles need names {action}"
