"""The KubeRay manifests (k8s/raycluster.yaml, k8s/rayjob.yaml) and the Dockerfile, checked offline: no
kubectl, cluster or container engine exists here, so nothing is applied or built. They parse; the RayJob's
cluster is the RayCluster's spec; every pod runs the project's image with a memory-backed, sized /dev/shm
and the shared volume where the run writes; GPU pods ask for whole GPUs in requests and limits and tell
Ray the same; the RayJob's entrypoint is the documented ``python jobs/pretrain.py`` command, loaded by
d3ray's own config loader, and fits the GPUs and CPUs its cluster starts with (d3ray's preflight rule);
the image installs the lock (requirements/node.txt) on the lock's Ray, with the lock's torch in the CUDA
build the launcher clusters (cluster.yaml) install.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import PurePosixPath

import pytest
import ray
import yaml

from d3ray.cli import parse_args
from d3ray.config import RunConfig
from d3ray.config_loading import load_config
from d3ray.run.preflight import cluster_problems
from tests.conftest import REPO
from tests.lockfile import locked_versions

IMAGE = "registry.example.com/d3ray:0.1.0"
UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def manifests(name: str) -> dict[str, dict]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all((REPO / "k8s" / name).read_text())}


def cluster_spec() -> dict:
    return manifests("raycluster.yaml")["RayCluster"]["spec"]


def groups(spec: dict) -> list[tuple[str, dict, dict]]:
    """(group name, rayStartParams, pod spec) of the head and every worker group."""
    out = [("head", spec["headGroupSpec"]["rayStartParams"], spec["headGroupSpec"]["template"]["spec"])]
    out += [(g["groupName"], g["rayStartParams"], g["template"]["spec"]) for g in spec["workerGroupSpecs"]]
    return out


def quantity(value: str) -> float:
    match = re.fullmatch(r"([\d.]+)([KMGT]i)?", str(value))
    assert match, f"unparsed quantity {value!r}"
    return float(match.group(1)) * UNITS.get(match.group(2) or "", 1)


def job_config(entrypoint: str) -> RunConfig:
    words = shlex.split(entrypoint)
    assert words[:2] == ["python", "jobs/pretrain.py"], "the documented entry point"
    args = parse_args(["pretrain", *words[2:]])
    return load_config(RunConfig, REPO / args.config, args.overrides)  # unknown keys, batch checks raise


def test_k8s_manifests_parse_with_kuberay_kinds_and_rayjob_cluster_is_the_raycluster():
    cluster, job = manifests("raycluster.yaml"), manifests("rayjob.yaml")
    assert set(cluster) == set(job) - {"RayJob"} | {"RayCluster"} == {"PersistentVolumeClaim", "RayCluster"}
    assert cluster["RayCluster"]["apiVersion"] == job["RayJob"]["apiVersion"] == "ray.io/v1"
    assert job["RayJob"]["spec"]["rayClusterSpec"] == cluster_spec(), "one cluster spec, in two files"
    assert cluster["PersistentVolumeClaim"] == job["PersistentVolumeClaim"]
    assert cluster_spec()["rayVersion"] == ray.__version__ == locked_versions()["ray"]
    assert cluster_spec()["authOptions"] == {"mode": "token"}


def test_k8s_manifests_pods_image_shm_and_shared_volume_everywhere():
    spec = cluster_spec()
    claim = manifests("raycluster.yaml")["PersistentVolumeClaim"]
    assert "ReadWriteMany" in claim["spec"]["accessModes"], "every pod mounts the run directories"
    for name, _, pod in groups(spec):
        (container,) = pod["containers"]
        assert container["image"] == IMAGE, name
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        shm = volumes[mounts["/dev/shm"]]["emptyDir"]
        assert shm["medium"] == "Memory", f"{name}: /dev/shm in memory (Ray's object store)"
        limits = container["resources"]["limits"]
        assert 0 < quantity(shm["sizeLimit"]) <= quantity(limits["memory"]) / 2, f"{name}: /dev/shm sized"
        shared = volumes[mounts["/mnt/d3ray"]]
        assert shared["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
        assert container["resources"]["requests"] == limits, f"{name}: requests = limits (guaranteed QoS)"
    assert spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0", "no work on the head"


def test_k8s_manifests_gpu_group_declares_whole_gpus_to_kubernetes_and_ray():
    by_name = {name: (params, pod) for name, params, pod in groups(cluster_spec())}
    params, pod = by_name["gpu-workers"]
    limits = pod["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == params["num-gpus"] == "1"
    assert json.loads(json.loads(params["resources"])) == {"gpu_node": 1}
    assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"]), "schedulable on tainted GPU pools"
    cpu_params, cpu_pod = by_name["cpu-workers"]
    assert "nvidia.com/gpu" not in cpu_pod["containers"][0]["resources"]["limits"]
    assert json.loads(json.loads(cpu_params["resources"])) == {"solver_node": 16}


def test_k8s_rayjob_entrypoint_loads_and_fits_the_cluster_it_starts():
    job = manifests("rayjob.yaml")["RayJob"]["spec"]
    cfg = job_config(job["entrypoint"])
    assert yaml.safe_load(job["runtimeEnvYAML"]) == {"working_dir": "/home/ray/d3ray"}, "the image's WORKDIR"
    spec = job["rayClusterSpec"]
    gpu = next(g for g in spec["workerGroupSpecs"] if g["groupName"] == "gpu-workers")
    pod_gpus = float(gpu["rayStartParams"]["num-gpus"])
    pod_cpus = quantity(gpu["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"])
    assert cfg.train.use_gpu and cfg.train.num_workers > 1
    assert cluster_problems(cfg, [pod_gpus] * gpu["replicas"]) == [], "fits the GPU pods it starts with"
    per_pod = -(-cfg.train.num_workers // gpu["replicas"])
    assert per_pod * cfg.train.cpus_per_worker <= pod_cpus
    shared = PurePosixPath("/mnt/d3ray")
    for path in (cfg.output_dir, cfg.storage_path):
        assert shared in PurePosixPath(path).parents, f"{path} is on the shared volume"


def test_k8s_dockerfile_installs_the_lock_like_cluster_yaml():
    text = (REPO / "Dockerfile").read_text()
    base = re.search(r"^FROM rayproject/ray:([\d.]+)-py311-cu(\d+)$", text, flags=re.M)
    assert base and base.group(1) == ray.__version__ == locked_versions()["ray"]
    setup = " ".join(yaml.safe_load((REPO / "cluster.yaml").read_text())["setup_commands"])
    torch_pins = re.findall(r'"torch==([\d.]+)"', text)
    assert torch_pins == [locked_versions()["torch"]] == re.findall(r'"torch==([\d.]+)"', setup)
    assert re.findall(r'"([\w\[\],.-]+)==', text) == ["torch"], "no second, hand-kept pin list"
    assert "COPY --chown=ray:users requirements/node.txt" in text and "pip install --no-cache-dir -r /tmp/node.txt" in text
    torch_index = re.search(r"download.pytorch.org/whl/cu(\d+)", text).group(1)
    assert torch_index == base.group(2) == re.search(r"whl/cu(\d+)", setup).group(1), "one CUDA 12.8 everywhere"
    assert "pip install --no-cache-dir --no-deps ." in text
    assert "WORKDIR /home/ray/d3ray" in text and "COPY --chown=ray:users jobs ./jobs" in text


@pytest.mark.parametrize("name", ["raycluster.yaml", "rayjob.yaml"])
def test_k8s_manifests_document_their_kubectl_commands(name):
    text = (REPO / "k8s" / name).read_text()
    assert f"kubectl apply -f k8s/{name}" in text
    guide = (REPO / "docs" / "deployment.md").read_text()
    assert f"kubectl apply -f k8s/{name}" in guide, "the cluster guide walks through it"


def test_k8s_readme_submit_command_is_the_rayjob_entrypoint():
    """The cluster guide's ``ray job submit`` onto the KubeRay cluster runs what the RayJob runs (both load and
    fit: tests/unit/test_preflight.py loads every guide pretrain command against cluster.yaml's GPUs)."""
    readme = (REPO / "docs" / "deployment.md").read_text()
    entrypoint = shlex.split(manifests("rayjob.yaml")["RayJob"]["spec"]["entrypoint"])
    submitted = []
    for block in re.findall(r"```bash\n(.*?)```", readme, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if "--address" in words and "jobs/pretrain.py" in words:
                submitted.append(words[words.index("python"):])
    assert submitted == [entrypoint]
