"""Shared fixtures: one real local Ray instance for the whole session, and the shared data path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"

os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
os.environ.setdefault("DS_ACCELERATOR", "cpu")


def shared_data(*parts: str) -> Path:
    """A path under ../shared/data, or skip the test with the reason."""
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"shared data not found at {path} (it lives beside the repository, in ../shared/data)")
    return path


def fresh_python(code: str) -> dict:
    """Run ``code`` in a fresh interpreter (this test process may have imported anything already) and
    return the JSON object its last printed line holds."""
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                         env={"DS_ACCELERATOR": "cpu", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def make_corpus(root: Path, seed: int, train_docs: int, validation_docs: int, train_shards: int,
                seq_len: int = 64) -> tuple[Path, Path]:
    """A generated SlimPajama-format corpus under ``root/data`` and a BPE tokenizer trained on it once
    (the runs that share it skip their own tokenizer training): (data dir, tokenizer dir)."""
    from d3ray.data.config import DataConfig
    from d3ray.data.sample import write_sample_corpus
    from d3ray.data.shards import list_shards
    from d3ray.data.tokenizer import ensure_tokenizer

    write_sample_corpus(root / "data", seed=seed, train_docs=train_docs, validation_docs=validation_docs,
                        train_shards=train_shards)
    data = DataConfig(train_paths=[str(root / "data" / "train")], seq_len=seq_len)
    return root / "data", ensure_tokenizer(data, list_shards(data.train_paths), root)


def start_local_ray():
    """A real local Ray instance (4 logical CPUs on any box), started once and shared by the Ray
    tests of the session; a test that needs its own cluster shuts it down and the next one restarts it."""
    import ray

    from d3ray.run.cluster import init_local_ray

    if not ray.is_initialized():
        try:
            init_local_ray(num_cpus=4, log_to_driver=False)
        except Exception as err:  # Ray waits 30 s (fixed) for its raylet: a box loaded by the other worker may miss it
            if "timed out during startup" not in str(err):
                raise
            ray.shutdown()
            init_local_ray(num_cpus=4, log_to_driver=False)
    return ray


def pytest_collection_modifyitems(items) -> None:
    """Tests that shut the shared Ray instance down to bring their own (marker ``own_ray``) run last: the
    shared instance then starts once per session instead of once more after each of them (~9 s each)."""
    items.sort(key=lambda item: item.get_closest_marker("own_ray") is not None)


@pytest.fixture
def ray_cluster():
    return start_local_ray()


@pytest.fixture(scope="session", autouse=True)
def _shutdown_ray_at_end():
    yield
    import sys

    if "ray" in sys.modules:
        sys.modules["ray"].shutdown()


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Test tensors are tiny: a second intra-op thread only spins (20x the CPU time on a 2-core box).
    Ray workers are other processes and keep their own setting."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def process_group():
    """A one-rank gloo process group for DeepSpeed in this process (a free loopback port), torn down
    after the module that asks for it."""
    import socket

    import deepspeed
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    deepspeed.init_distributed(dist_backend="gloo")
    yield
    dist.destroy_process_group()
    # DeepSpeed caches the destroyed groups (its comm backend, its world and data-parallel groups): the next
    # module's engine would broadcast over them, so they go too.
    deepspeed.comm.comm.cdb = None
    for name in ("_WORLD_GROUP", "_DATA_PARALLEL_GROUP", "_MODEL_PARALLEL_GROUP", "_ZERO_PARAM_INTRA_PARALLEL_GROUP"):
        setattr(deepspeed.utils.groups, name, None)
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture
def moto_s3(monkeypatch, tmp_path):
    """A real S3-compatible server (moto's server mode, standing in for the cloud provider) on a free
    loopback port, and the environment that points every AWS client at it (``AWS_ENDPOINT_URL``, moto's
    ``testing`` credentials from no file, no metadata lookup). Yields the port; skips without moto."""
    import logging
    import socket

    moto_server = pytest.importorskip("moto.server", reason="moto[server] is not installed (pip install -e '.[dev]')")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one INFO line per request otherwise
    server.start()
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    for key, value in {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "testing",
                       "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                       "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
                       "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
                       "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-credentials")}.items():
        monkeypatch.setenv(key, value)
    try:
        yield port
    finally:
        server.stop()
