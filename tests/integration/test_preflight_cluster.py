"""Preflight against a real local Ray cluster declared with fake GPUs (GPUs are only resources to Ray):
``check_cluster`` reads the alive nodes' GPUs and refuses, in one line, a run that asks for more."""

from __future__ import annotations

import os

import pytest

from d3ray.config import RunConfig
from d3ray.config_loading import load_config
from d3ray.errors import UserError
from d3ray.train.preflight import check_cluster

pytestmark = [pytest.mark.ray, pytest.mark.own_ray]


def test_preflight_cluster_two_fake_gpus_refuses_four_ranks_and_fits_two():
    import ray

    ray.shutdown()  # this test brings its own instance; the next Ray test restarts the shared one
    os.environ.pop("RAY_API_SERVER_ADDRESS", None)
    ray.init(address="local", num_cpus=1, num_gpus=2, include_dashboard=False, log_to_driver=False)
    try:
        four = load_config(RunConfig, None, ["--train.num_workers=4", "--train.micro_batch_size=2",
                                             "--train.gpus_per_worker=1"])
        with pytest.raises(UserError) as err:
            check_cluster(four, fixed=True)
        assert str(err.value).startswith("the run asks 4 GPUs (train.num_workers=4 x train.gpus_per_worker=1)")
        assert "cluster has 2" in str(err.value) and "\n" not in str(err.value)
        check_cluster(four, fixed=False)  # a cluster that can grow: a warning only
        two = load_config(RunConfig, None, ["--train.num_workers=2", "--train.gpus_per_worker=0.75",
                                            "--schedule.type=d3", "--schedule.influence_num_gpus=0.25"])
        check_cluster(two, fixed=True)  # 2 x 0.75 + 0.25 on 2 GPUs, each rank on its own
    finally:
        ray.shutdown()
