"""``ray job submit`` end to end: a local head on loopback, the tiny pretrain job through the Job
Submission API, SUCCEEDED, its outputs on disk; then only that head is stopped.

The head is its own Ray instance (free ports, its own ``--temp-dir`` and auth token), so it does not
collide with the session's ``ray_cluster`` fixture or any other Ray on the machine. It runs as
``ray start --head --block`` in a new session: SIGTERM to that process stops exactly the
processes it started (``ray stop`` would stop every Ray on the machine), and a SIGKILL to its
process group catches any straggler. Data and outputs are passed by absolute path; only the code
(the repository, minus .gitignore/.rayignore) is shipped as the working dir.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from d3ray.run_files import read_jsonl
from tests.conftest import REPO

pytestmark = [pytest.mark.ray, pytest.mark.slow]

STEPS = 4
START_TIMEOUT_S = 180
JOB_TIMEOUT_S = 420


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def ray_head(tmp_path):
    """A separate Ray head (4 CPUs) on loopback; yields (dashboard URL, auth headers, its process)."""
    temp_dir = tempfile.mkdtemp(prefix="d3rj", dir="/tmp")  # short: Ray's unix socket paths must fit
    token = secrets.token_hex(32)
    dashboard_port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")}
    env.update(
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN=token,
        # Train V2's PlacementGroupCleaner looks its cluster up through the State API; with several Ray
        # instances on this machine "auto" is ambiguous, so every process of this head is told its own
        RAY_API_SERVER_ADDRESS=f"http://127.0.0.1:{dashboard_port}",
        RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0",  # SIGTERM stops at once (no 30 s drain of an idle node)
        RAY_TRAIN_HEALTH_CHECK_INTERVAL_S="0.2",
        RAY_DATA_DISABLE_PROGRESS_BARS="1",
        TOKENIZERS_PARALLELISM="false",
        DS_ACCELERATOR="cpu",
    )
    command = [
        sys.executable,
        "-m",
        "ray.scripts.scripts",
        "start",
        "--head",
        "--block",
        "--disable-usage-stats",
        "--num-cpus=4",
        "--object-store-memory=300000000",
        f"--temp-dir={temp_dir}",
        "--node-ip-address=127.0.0.1",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={dashboard_port}",
        f"--port={free_port()}",
        f"--ray-client-server-port={free_port()}",
        f"--dashboard-agent-listen-port={free_port()}",
        f"--dashboard-agent-grpc-port={free_port()}",
        f"--metrics-export-port={free_port()}",
        f"--runtime-env-agent-port={free_port()}",
        f"--node-manager-port={free_port()}",
        f"--object-manager-port={free_port()}",
    ]
    log = open(tmp_path / "ray_head.log", "w")
    head = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    address, headers = f"http://127.0.0.1:{dashboard_port}", {"Authorization": f"Bearer {token}"}
    try:
        yield address, headers, head
    finally:
        head.send_signal(signal.SIGTERM)  # `ray start --block` stops the processes it started
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(head.pid, signal.SIGKILL)  # anything left in its session (only ours)
        except ProcessLookupError:
            pass
        head.wait()
        log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)


def until_ready(head: subprocess.Popen, attempt, timeout_s: float = START_TIMEOUT_S):
    """``attempt()``, retried while the head is still coming up (dashboard not listening yet, or its
    job agent not registered: "No available agent to submit job"). Waiting on the head process is
    the pause between tries, and it fails the test at once if the head exits."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return attempt()
        except (ConnectionError, RuntimeError) as err:
            starting = isinstance(err, ConnectionError) or "No available agent" in str(err)
            if not starting or time.monotonic() > deadline:
                raise
        try:
            head.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            continue
        pytest.fail(f"ray start exited with {head.returncode}")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from d3ray.data.config import DataConfig
    from d3ray.data.sample import write_sample_corpus
    from d3ray.data.shards import list_shards
    from d3ray.data.tokenizer import ensure_tokenizer

    root = tmp_path_factory.mktemp("job_corpus")
    write_sample_corpus(root / "data", seed=4, train_docs=200, validation_docs=70, train_shards=2)
    data = DataConfig(train_paths=[str(root / "data" / "train")], seq_len=64)
    return root / "data", ensure_tokenizer(data, list_shards(data.train_paths), root)


async def _follow(client, job_id: str) -> str:
    """The job's whole log; returns when the job has ended (the log stream closes)."""
    chunks = []
    async for lines in client.tail_job_logs(job_id):
        chunks.append(lines)
    return "".join(chunks)


def test_job_submit_tiny_pretrain_succeeds_and_writes_run_dir(ray_head, corpus, tmp_path):
    from ray.job_submission import JobStatus, JobSubmissionClient

    address, headers, head = ray_head
    data_dir, tokenizer = corpus
    out = tmp_path / "runs"
    args = [
        "jobs/pretrain.py",
        "--config",
        "jobs/configs/tiny.yaml",
        "--name=job-test",
        f"--output_dir={out}",
        f"--data.train_paths=[{data_dir / 'train'}]",
        f"--data.validation_paths=[{data_dir / 'validation'}]",
        f"--data.tokenizer.path={tokenizer}",
        "--data.seq_len=64",
        f"--train.steps={STEPS}",
        "--train.micro_batch_size=2",
        "--train.eval_every=0",
        "--schedule.L=2",
        "--eval.max_sequences_per_domain=2",
    ]
    client = until_ready(head, lambda: JobSubmissionClient(address, headers=headers))
    entrypoint = " ".join([sys.executable, *args])
    job_id = until_ready(
        head, lambda: client.submit_job(entrypoint=entrypoint, runtime_env={"working_dir": str(REPO)})
    )
    logs = asyncio.run(asyncio.wait_for(_follow(client, job_id), JOB_TIMEOUT_S))
    status = client.get_job_status(job_id)

    assert status == JobStatus.SUCCEEDED, logs[-3000:]
    assert f"finished {STEPS} steps" in logs
    run_dir = out / "job-test"
    final = json.loads((run_dir / "final_metrics.json").read_text())
    assert final["steps"] == STEPS and final["run_dir"] == str(run_dir)
    assert [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl") if "train/loss" in r] == list(
        range(1, STEPS + 1)
    )
    assert list(run_dir.glob("checkpoint_*")), "checkpoints written by path, outside the working dir"
