"""Preflight (d3ray/run/preflight.py) and the GPU rules of TrainConfig: a run that cannot work where it is
started stops with one line naming the field and the fix; the cluster guide's (docs/deployment.md) command loads and fits
cluster.yaml's GPUs."""

from __future__ import annotations

import re
import shlex

import pytest
import yaml

from d3ray.cli import parse_args
from d3ray.config import RunConfig
from d3ray.config_loading import ConfigError, load_config
from d3ray.errors import UserError
from d3ray.run.preflight import check_environment, cluster_problems, environment_problems, storage_problem
from tests.conftest import REPO


def config(*overrides: str) -> RunConfig:
    return load_config(RunConfig, None, list(overrides))


def test_train_config_half_gpu_two_workers_names_fields_and_fix():
    with pytest.raises(ConfigError) as err:
        config("--train.num_workers=2", "--train.gpus_per_worker=0.5")
    message = str(err.value)
    assert "\n" not in message
    assert "train.gpus_per_worker=0.5" in message and "train.num_workers=2" in message
    assert "train.gpus_per_worker above 0.5" in message


def test_train_config_fractional_gpu_one_worker_or_above_half_loads():
    assert config("--train.num_workers=1", "--train.gpus_per_worker=0.5").train.gpus_per_worker == 0.5
    assert config("--train.num_workers=2", "--train.gpus_per_worker=0.75").train.gpus_per_worker == 0.75


def test_train_config_non_whole_gpus_above_one_refused():
    with pytest.raises(ConfigError, match=r"train\.gpus_per_worker=1\.5.*whole GPUs"):
        config("--train.num_workers=1", "--train.gpus_per_worker=1.5")


def test_train_config_batch_not_splitting_names_fields_and_fix():
    with pytest.raises(ConfigError, match=r"train\.num_workers\*train\.micro_batch_size=16: lower train\.micro"):
        config("--train.num_workers=4", "--train.micro_batch_size=4", "--train.global_batch_size=8")


def test_preflight_flash_attention_on_cpu_refused_with_the_fix():
    cfg = config("--model.attn_implementation=flash_attention_2")
    problems = environment_problems(cfg)
    assert len(problems) == 1
    assert problems[0].startswith("model.attn_implementation=flash_attention_2 runs on GPUs only")


def test_preflight_flash_attention_without_package_names_the_extra():
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("flash-attn is installed here")
    cfg = config("--model.attn_implementation=flash_attention_2", "--train.num_workers=1",
                 "--train.gpus_per_worker=1")
    with pytest.raises(UserError, match=r"pip install 'd3ray\[flash\]'") as err:
        check_environment(cfg)
    assert "\n" not in str(err.value)


def test_preflight_storage_path_unknown_scheme_refused():
    problem = storage_problem("ftp://host/checkpoints")
    assert problem is not None and problem.startswith("storage_path='ftp://host/checkpoints'")
    assert "s3://" in problem


def test_preflight_storage_path_scheme_without_its_pyarrow_module_refused():
    problem = storage_problem("s3://bucket/ckpt", importable=lambda name: name != "pyarrow._s3fs")
    assert problem is not None and "pyarrow._s3fs" in problem


def test_preflight_storage_path_local_and_s3_with_pyarrow_pass():
    import importlib.util

    assert storage_problem("/mnt/shared/ckpt") is None and storage_problem(None) is None
    if importlib.util.find_spec("pyarrow._s3fs") is not None:
        assert storage_problem("s3://bucket/ckpt") is None


def test_preflight_direct_checkpoints_to_a_uri_refused_with_the_fix():
    problems = environment_problems(config("--storage_path=s3://bucket/ckpt", "--train.checkpoint_upload=direct"))
    assert [p for p in problems if p.startswith("train.checkpoint_upload=direct")] == [
        "train.checkpoint_upload=direct saves into storage_path's directories, which "
        "storage_path='s3://bucket/ckpt' is not: use train.checkpoint_upload=auto or async"]
    for fine in (config("--storage_path=/mnt/shared/ckpt", "--train.checkpoint_upload=direct"),
                 config("--storage_path=s3://bucket/ckpt"), config("--train.checkpoint_upload=direct")):
        assert not [p for p in environment_problems(fine) if "checkpoint_upload" in p]


def test_checkpoint_upload_in_place_on_a_local_filesystem_only():
    import pyarrow.fs

    from d3ray.train.checkpointer import upload_in_place

    local, remote = pyarrow.fs.LocalFileSystem(), pyarrow.fs.SubTreeFileSystem("/tmp", pyarrow.fs.LocalFileSystem())
    assert upload_in_place("auto", local) and upload_in_place("direct", local)
    assert not upload_in_place("async", local) and not upload_in_place("sync", local)
    assert not upload_in_place("auto", remote)  # a filesystem Ray Train copies to: auto uploads asynchronously
    with pytest.raises(ValueError, match="checkpoint_upload=direct needs a filesystem storage_path"):
        upload_in_place("direct", remote)


def test_preflight_data_path_scheme_without_fsspec_backend_names_field():
    # abfs:// (adlfs): a scheme fsspec knows whose package no extra installs (the dev install has s3fs, gcsfs)
    try:
        import adlfs  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("adlfs is installed here")
    cfg = config("--data.train_paths=[abfs://container/train]")
    problems = environment_problems(cfg)
    assert len(problems) == 1
    assert problems[0].startswith("data.train_paths='abfs://container/train': no abfs:// filesystem installed")
    assert "adlfs" in problems[0]


def test_preflight_default_config_has_no_problems():
    assert environment_problems(config()) == []


def test_preflight_cluster_too_few_gpus_names_fields_and_counts():
    cfg = config("--train.num_workers=4", "--train.micro_batch_size=2", "--train.gpus_per_worker=1",
                 "--schedule.type=d3", "--schedule.placement={type: actors, num_gpus: 0.25}")
    problems = cluster_problems(cfg, [1.0, 1.0, 1.0, 1.0])
    assert len(problems) == 1
    # 4.25 GPUs of shares, on 5 GPUs: the 0.25 cannot go on a GPU a rank holds whole
    assert "asks 5 GPUs" in problems[0] and "cluster has 4" in problems[0] and "+ 0.25 for the scheduler" in problems[0]
    assert "train.num_workers=4" in problems[0] and "train.gpus_per_worker=1" in problems[0]
    assert cluster_problems(cfg, [1.0] * 5) == []


def test_preflight_cluster_gpu_run_on_cpu_cluster_suggests_cpu_training():
    cfg = config("--train.num_workers=1", "--train.gpus_per_worker=1")
    (problem,) = cluster_problems(cfg, [0.0])
    assert "asks 1 GPU (" in problem and "cluster has 0" in problem and "train.gpus_per_worker=0" in problem


def test_preflight_cluster_trainers_need_distinct_gpus():
    cfg = config("--train.num_workers=2", "--train.gpus_per_worker=0.75")
    (problem,) = cluster_problems(cfg, [1.0])  # 1.5 GPUs in total would not fit either; 2 distinct are asked
    assert "asks 2 GPUs" in problem
    assert cluster_problems(cfg, [2.0]) == []


def test_preflight_cluster_counts_fractional_shares_as_ray_places_them():
    """2 ranks of 0.6 and a D3 influence actor of 0.6 are 1.8 GPUs of shares but hold 3 GPUs (no two
    shares above 0.5 fit one GPU): on 2 GPUs the run would wait forever, so it is refused."""
    cfg = config("--train.num_workers=2", "--train.gpus_per_worker=0.6", "--schedule.type=d3",
                 "--schedule.placement={type: actors, num_gpus: 0.6}")
    (problem,) = cluster_problems(cfg, [1.0, 1.0])
    assert "asks 3 GPUs" in problem and "cluster has 2" in problem
    assert cluster_problems(cfg, [1.0, 1.0, 1.0]) == []
    small = config("--train.num_workers=2", "--train.gpus_per_worker=0.6", "--schedule.type=d3",
                   "--schedule.placement={type: actors, num_gpus: 0.4}")  # the 0.4 fits beside a rank's 0.6
    assert cluster_problems(small, [1.0, 1.0]) == []


def test_preflight_cluster_rank_wider_than_any_node_refused():
    cfg = config("--train.num_workers=1", "--train.gpus_per_worker=4")
    (problem,) = cluster_problems(cfg, [2.0, 2.0])
    assert problem.startswith("train.gpus_per_worker=4 exceeds the GPUs of any one node (2)")


def readme_pretrain_commands() -> list[list[str]]:
    """The arguments of every ``python jobs/pretrain.py`` command of the cluster guide (docs/deployment.md)."""
    section = (REPO / "docs" / "deployment.md").read_text()
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", section, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if "jobs/pretrain.py" in words:
                commands.append(words[words.index("jobs/pretrain.py") + 1:])
    return commands


def test_readme_scale_out_command_loads_and_fits_cluster_yaml_gpus():
    commands = readme_pretrain_commands()
    assert commands, "the cluster guide has a jobs/pretrain.py command"
    cluster = yaml.safe_load((REPO / "cluster.yaml").read_text())
    gpu_nodes = [float(t["resources"].get("GPU", 0)) for t in cluster["available_node_types"].values()
                 for _ in range(t.get("max_workers", 0))][: cluster["max_workers"]]
    for argv in commands:
        args = parse_args(["pretrain", *argv])
        cfg = load_config(RunConfig, REPO / args.config, args.overrides)  # raises on the batch-size check
        assert cfg.train.num_workers > 1 and cfg.train.use_gpu, "the scale-out command trains on several GPUs"
        assert cluster_problems(cfg, gpu_nodes) == []
