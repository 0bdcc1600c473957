"""Placement on fake GPUs (#27): a local Ray cluster declared with 8 GPUs (Ray schedules GPUs as resources;
no device is needed) places what d3ray asks for where it should.

- trainer ranks: the ScalingConfig ``trainer_scaling_config`` builds (d3ray/run/pretrain.py) for
  ``gpus_per_worker=1, num_workers=2`` gives the 2 ranks 2 distinct GPU ids (fractional ranks: the sweep
  cases below place their bundles);
- influence and scoring actors, started by the schedulers' own code (``D3Scheduler``, ``start_scorer``
  through the curriculum scheduler) for configs that ask for GPU shares, hold those shares, so
  ``device_for_resources("auto", ..., cuda_available=True)`` picks cuda for them and cpu for the ones
  with ``num_gpus=0``; ``actor_threads()`` equals the CPUs they reserved;
- sweep accounting (d3ray/tune/trial_resources.py): ``concurrent_trials`` against the cluster's
  ``ray.cluster_resources()`` equals the number of trials whose trainer ranks and scheduler actors
  Ray actually places at once (placement groups of each trial's bundles; one more stays pending);
- the preflight (``check_cluster``, d3ray/run/preflight.py) reads the alive nodes' GPUs and refuses, in one
  line, a run that asks for more.

The cluster runs in a subprocess (this file run as a script): the test session shares one local Ray
instance (``ray_cluster`` in tests/conftest.py) and ``num_gpus`` needs a fresh one. The script prints one
JSON line; the test checks it against numbers known independently of d3ray's functions. About 90 s
on a 2-core box (a Train run and four model actors start; most of it is their imports).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
GPUS = 8
CPUS = 32  # logical CPUs: enough that GPUs bind in every check below


def config(*overrides: str):
    from d3ray.config import RunConfig
    from d3ray.config_loading import load_config

    return load_config(RunConfig, None, list(overrides))


def _rank_report(report_dir: str) -> None:
    """A Ray Train worker function: what this rank holds, written to ``report_dir/<rank>.json``."""
    import ray
    import ray.train

    rank = ray.train.get_context().get_world_rank()
    out = {"rank": rank, "gpu_ids": [str(i) for i in ray.get_gpu_ids()],
           "resources": dict(ray.get_runtime_context().get_assigned_resources()),
           "cuda_visible": os.environ.get("CUDA_VISIBLE_DEVICES")}
    Path(report_dir, f"{rank}.json").write_text(json.dumps(out))


def trainer_ranks(train_cfg, name: str, storage: str) -> list[dict]:
    """Run a TorchTrainer with d3ray's ScalingConfig for ``train_cfg`` and a worker function that
    reports each rank's GPU ids and resources (DeepSpeed's loop needs CUDA for use_gpu; the placement
    is the ScalingConfig's). gloo: this torch has no NCCL."""
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    from d3ray.run.pretrain import trainer_scaling_config

    report_dir = tempfile.mkdtemp(dir=storage)
    TorchTrainer(lambda: _rank_report(report_dir), torch_config=TorchConfig(backend="gloo"),
                 scaling_config=trainer_scaling_config(train_cfg),
                 run_config=ray.train.RunConfig(name=name, storage_path=storage)).fit()
    return [json.loads(p.read_text()) for p in sorted(Path(report_dir).glob("*.json"))]


def actor_view(actor) -> dict:
    """What an actor holds and chose, asked inside its process (as ``write_placement`` does)."""
    import ray

    def look(self) -> dict:
        import torch

        from d3ray.influence.resources import actor_resources, actor_threads, device_for_resources

        resources = actor_resources()
        return {"resources": resources, "gpu_ids": [str(i) for i in ray.get_gpu_ids()],
                "device_if_cuda": str(device_for_resources("auto", resources, cuda_available=True)),
                "device": str(getattr(self, "device", None)),  # what the actor chose (solvers: none)
                "threads": actor_threads(), "torch_threads": torch.get_num_threads()}

    return ray.get(actor.__ray_call__.remote(look), timeout=400)


def build_scheduler(name: str, overrides: list[str], run_dir: str):
    """The scheduler of a config, built by its own code (its actors start now, in the background)."""
    from d3ray.model import model_config_dict
    from d3ray.schedule.scheduler import BuildContext

    cfg = config(*overrides)
    model_config = model_config_dict(cfg.model, 64, 8, 0)
    ctx = BuildContext(seed=0, model_config=model_config, model=cfg.model, run_name=f"fake-gpu-{name}",
                       run_dir=run_dir, batch_size=cfg.train.global_batch_size, total_chunks=1)
    return cfg.schedule.build(ctx)


def scheduler_view(scheduler) -> dict[str, list[dict]]:
    """What each actor of a scheduler holds, by role; the actors are then stopped."""
    try:
        return {role: [actor_view(a) for a in actors] for role, actors in scheduler.actors().items()}
    finally:
        scheduler.close()


def placed_trials(cfg, driver_cpus: float, trials: int) -> int:
    """Of ``trials`` trials of ``cfg`` requested at once, how many Ray places: one placement group per
    trial with a bundle per trainer rank (``trainer_resources``), per scheduler actor
    (``actor_requests``) and one for the rest of ``trial_resources`` (driver, Ray Data, tokenizers)."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    from d3ray.run.pretrain import trainer_resources
    from d3ray.tune.trial_resources import trial_resources

    bundles = [trainer_resources(cfg.train)] * cfg.train.num_workers
    for request in cfg.schedule.actor_requests():
        bundles += [{k: v for k, v in request.resources.items() if v}] * request.count
    rest = trial_resources(cfg, driver_cpus)["CPU"] - sum(b.get("CPU", 0.0) for b in bundles)
    bundles.append({"CPU": rest})
    while ray.available_resources().get("GPU", 0.0) < GPUS:  # the previous case's groups are being removed
        time.sleep(0.1)
    groups = [placement_group(bundles, strategy="PACK") for _ in range(trials)]
    try:  # groups that fit are placed at once (in the order asked); one that does not stays pending
        refs = [g.ready() for g in groups]
        ready, _ = ray.wait(refs, num_returns=trials - 1, timeout=30)
        if len(ready) == trials - 1:
            ready, _ = ray.wait(refs, num_returns=trials, timeout=2)
        return len(ready)
    finally:
        for group in groups:
            remove_placement_group(group)


SWEEP_CASES = {  # name: overrides of one trial
    "2x1gpu": ["--train.num_workers=2", "--train.gpus_per_worker=1"],
    "2x0.6gpu": ["--train.num_workers=2", "--train.gpus_per_worker=0.6"],
    "2x0.75gpu+d3_0.25": ["--train.num_workers=2", "--train.gpus_per_worker=0.75", "--schedule.type=d3",
                          "--schedule.placement={type: actors, num_gpus: 0.25, num_cpus: 1, nice: 19}"],
}


SCHEDULERS = {  # name: overrides of a scheduler whose actors ask for GPU shares, or none
    # a sketched residual: S needs the solver pool (the default, the potential alone, sorts in the influence actor)
    "d3_gpu": ["--schedule.type=d3", "--schedule.placement={type: actors, num_gpus: 0.5, num_cpus: 2, nice: 19}",
               "--schedule.influence.estimator.residual=sketch"],
    "d3_cpu": ["--schedule.type=d3", "--schedule.placement={type: actors, num_cpus: 1, nice: 19}"],
    "curriculum_gpu": ["--schedule.type=curriculum", "--schedule.scorer_num_gpus=0.25",
                       "--schedule.scorer_num_cpus=3"],
    "curriculum_cpu": ["--schedule.type=curriculum", "--schedule.scorer_num_cpus=2"],
}


def _log(started: float, what: str) -> None:
    print(f"[{time.perf_counter() - started:6.1f}s] {what}", file=sys.stderr, flush=True)


def probe() -> dict:
    """Everything the test checks, on a fresh local cluster with fake GPUs (runs in the subprocess).

    The Train run and the schedulers' actors start at once: the cluster has room for all of them
    (2 GPUs of ranks, 0.75 of actors, on 8), and their start-ups overlap."""
    import ray

    from d3ray.tune.trial_resources import concurrent_trials

    started = time.perf_counter()
    os.environ.pop("RAY_ADDRESS", None)
    ray.init(address="local", num_cpus=CPUS, num_gpus=GPUS, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2"}})
    out: dict = {"cluster": {k: v for k, v in ray.cluster_resources().items() if not k.startswith("node:")}}
    _log(started, "ray up")
    try:
        storage = tempfile.mkdtemp(prefix="d3ray-fake-gpu-")
        fit = ray.remote(num_cpus=0)(trainer_ranks)  # in a task, as a sweep's trial driver runs it
        runs = {"ranks_2x1": fit.remote(config("--train.num_workers=2", "--train.gpus_per_worker=1").train,
                                        "ranks_2x1", storage)}
        schedulers = {name: build_scheduler(name, overrides, storage) for name, overrides in SCHEDULERS.items()}
        for name, scheduler in schedulers.items():
            out[name] = scheduler_view(scheduler)
            _log(started, f"{name} actors seen")
        for name, ref in runs.items():
            out[name] = ray.get(ref, timeout=400)
            _log(started, f"{name} seen")
        for name, overrides in SWEEP_CASES.items():
            cfg = config(*overrides)
            derived, per_trial = concurrent_trials(out["cluster"], [cfg], driver_cpus=0.01)
            out.setdefault("sweep", {})[name] = {"derived": derived, "per_trial": per_trial,
                                                 "placed": placed_trials(cfg, 0.01, derived + 1)}
        _log(started, "sweep placements done")
        out["preflight"] = preflight_answers()
    finally:
        ray.shutdown()
        _log(started, "ray down")
    return out


def preflight_answers() -> dict:
    """``check_cluster`` against the alive nodes' 8 GPUs: 9 ranks of 1 GPU (refused in one line on a fixed
    cluster, a warning on one that can grow) and 8 ranks of 0.75 with a D3 influence actor of 0.25 (fits)."""
    from d3ray.errors import UserError
    from d3ray.run.preflight import check_cluster

    nine = config("--train.num_workers=9", "--train.global_batch_size=9", "--train.micro_batch_size=1",
                  "--train.gpus_per_worker=1")
    answers: dict = {}
    try:
        check_cluster(nine, fixed=True)
    except UserError as err:
        answers["nine_fixed"] = str(err)
    check_cluster(nine, fixed=False)
    check_cluster(config("--train.num_workers=8", "--train.micro_batch_size=1", "--train.gpus_per_worker=0.75",
                         "--schedule.type=d3", "--schedule.placement={type: actors, num_gpus: 0.25, nice: 19}"), fixed=True)
    answers["fits"] = True
    return answers


@pytest.fixture(scope="module")
def placement() -> dict:
    env = {**os.environ, "RAY_DATA_DISABLE_PROGRESS_BARS": "1", "PYTHONPATH": str(REPO)}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, __file__], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900)
    print("".join(line + "\n" for line in proc.stderr.splitlines() if line.startswith("[")))  # phase times
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, f"probe failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}"
    return json.loads(lines[-1])


def test_cluster_declares_the_fake_gpus(placement):
    assert placement["cluster"]["GPU"] == GPUS and placement["cluster"]["CPU"] == CPUS


def test_two_trainer_ranks_hold_one_whole_gpu_each_on_distinct_ids(placement):
    ranks = placement["ranks_2x1"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert [r["resources"].get("GPU") for r in ranks] == [1.0, 1.0]
    ids = [r["gpu_ids"] for r in ranks]
    assert all(len(i) == 1 for i in ids) and len({i[0] for i in ids}) == 2, ids


def test_an_influence_actor_holds_its_gpu_share_and_chooses_cuda(placement):
    (actor,) = placement["d3_gpu"]["influence"]
    assert actor["resources"].get("GPU") == 0.5 and len(actor["gpu_ids"]) == 1
    assert actor["device_if_cuda"] == "cuda:0"
    assert actor["device"] == "cpu"  # no CUDA in this torch: auto falls back, whatever it holds
    assert actor["resources"]["CPU"] == 2.0 and actor["threads"] == actor["torch_threads"] == 2
    assert placement["d3_gpu"]["solver"]
    for solver in placement["d3_gpu"]["solver"]:  # the solver pool holds no GPU
        assert not solver["resources"].get("GPU") and solver["device_if_cuda"] == "cpu"


def test_influence_actors_without_gpus_choose_the_cpu(placement):
    (actor,) = placement["d3_cpu"]["influence"]
    assert "solver" not in placement["d3_cpu"], "the potential alone sorts in the influence actor"
    assert not actor["resources"].get("GPU") and actor["gpu_ids"] == []
    assert actor["device_if_cuda"] == "cpu" and actor["threads"] == actor["torch_threads"] == 1


def test_scoring_actors_follow_their_gpu_share(placement):
    (gpu,) = placement["curriculum_gpu"]["scorer"]
    assert gpu["resources"].get("GPU") == 0.25 and len(gpu["gpu_ids"]) == 1 and gpu["device_if_cuda"] == "cuda:0"
    assert gpu["resources"]["CPU"] == 3.0 and gpu["threads"] == gpu["torch_threads"] == 3
    (cpu,) = placement["curriculum_cpu"]["scorer"]
    assert not cpu["resources"].get("GPU") and cpu["device_if_cuda"] == "cpu"
    assert cpu["threads"] == cpu["torch_threads"] == 2


def test_preflight_refuses_more_gpus_than_the_cluster_has_in_one_line_and_fits_what_it_places(placement):
    refused = placement["preflight"]["nine_fixed"]
    assert refused.startswith("the run asks 9 GPUs (train.num_workers=9 x train.gpus_per_worker=1)"), refused
    assert "cluster has 8" in refused and "\n" not in refused
    assert placement["preflight"]["fits"]  # 8 ranks of 0.75 + an actor of 0.25 on 8 GPUs, each rank on its own


@pytest.mark.parametrize("case, expected", [("2x1gpu", 4),  # 8 GPUs // 2 per trial
                                            ("2x0.6gpu", 4),  # 0.4 of each GPU stays idle: not 8 // 1.2 = 6
                                            ("2x0.75gpu+d3_0.25", 4)])  # the actors fill the ranks' leftovers
def test_sweep_concurrency_is_what_the_cluster_places(placement, case, expected):
    sweep = placement["sweep"][case]
    assert sweep["derived"] == expected
    assert sweep["placed"] == expected  # of expected + 1 requested at once, one stays pending


def test_gpus_held_and_concurrency_without_ray():
    """The same accounting on paper: fractions above 0.5 never share a GPU; smaller ones fill leftovers;
    a sweep takes the trial that fits least."""
    from d3ray.run.cluster import gpus_held
    from d3ray.tune.trial_resources import concurrent_trials

    assert gpus_held([0.6, 0.6]) == 2 and gpus_held([0.75, 0.75, 0.25, 0.25]) == 2
    assert gpus_held([0.5, 0.5, 0.25]) == 2 and gpus_held([2.0, 0.5]) == 3
    cluster = {"CPU": 64.0, "GPU": 4.0}
    two_by_06 = config(*SWEEP_CASES["2x0.6gpu"])
    assert concurrent_trials(cluster, [two_by_06], 0.01)[0] == 2  # 4 // 1.2 = 3 would leave one waiting
    one_by_05 = config("--train.num_workers=1", "--train.gpus_per_worker=0.5")
    assert concurrent_trials(cluster, [one_by_05], 0.01)[0] == 8  # two single ranks share each GPU
    assert concurrent_trials(cluster, [one_by_05, two_by_06], 0.01)[0] == 2


if __name__ == "__main__":
    print(json.dumps(probe()), flush=True)
