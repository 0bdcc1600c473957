"""``ray job submit`` end to end: a local head on loopback, the tiny pretrain job through the
``ray job submit`` CLI as a user runs it, SUCCEEDED, its outputs on disk; then only that head is stopped.
What the user sees of the job (its driver's console, tailed by ``ray job submit``) is where the run lives,
progress lines, the eval line and the final schedule summary; no Python warnings and no metric-dict dumps
(those go to the run directory's logs).

The head is its own Ray instance (free ports, its own ``--temp-dir`` and auth token), so it does not
collide with the session's ``ray_cluster`` fixture or any other Ray on the machine. It runs as
``ray start --head --block`` in a new session: SIGTERM to that process stops exactly the
processes it started (``ray stop`` would stop every Ray on the machine), and a SIGKILL to its
process group catches any straggler. Data and outputs are passed by absolute path; only the code
(the repository, minus .gitignore/.rayignore) is shipped as the working dir.
"""

from __future__ import annotations

import json
import os
import re
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
    """A separate Ray head (4 CPUs) on loopback; yields (dashboard URL, the environment of a shell that
    talks to it: its auth token, its process)."""
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
    try:
        yield f"http://127.0.0.1:{dashboard_port}", env, head
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


def ray_cli(env: dict[str, str], *args: str, timeout_s: float) -> subprocess.CompletedProcess:
    """``ray ARGS`` as a user's shell runs it, with the head's auth token in its environment. A CLI, not
    the Python SDK in this process: the SDK caches the auth token of the first Ray it met per process."""
    return subprocess.run([sys.executable, "-m", "ray.scripts.scripts", *args], env=env, capture_output=True,
                          text=True, timeout=timeout_s)


def until_ready(head: subprocess.Popen, address: str, env: dict[str, str]) -> None:
    """Wait until the head's job server answers (``ray job list``); fails the test at once if the head exits."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        probe = ray_cli(env, "job", "list", f"--address={address}", timeout_s=60)
        if probe.returncode == 0:
            return
        if head.poll() is not None:
            pytest.fail(f"ray start exited with {head.returncode}")
        if time.monotonic() > deadline:
            pytest.fail(f"the head's job server did not answer within {START_TIMEOUT_S}s:\n{probe.stderr[-2000:]}")
        time.sleep(1.0)


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


def test_job_submit_tiny_pretrain_succeeds_and_writes_run_dir(ray_head, corpus, tmp_path):
    address, env, head = ray_head
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
        "--train.log_every=2",
        "--schedule.L=2",
        "--eval.max_sequences_per_domain=2",
    ]
    until_ready(head, address, env)
    for _ in range(30):  # the job agent registers a moment after the job server answers
        job = ray_cli(env, "job", "submit", f"--address={address}", f"--working-dir={REPO}", "--",
                      sys.executable, *args, timeout_s=JOB_TIMEOUT_S)
        logs = job.stdout + job.stderr
        if "No available agent" not in logs:
            break
        time.sleep(1.0)

    assert job.returncode == 0 and "succeeded" in logs, logs[-3000:]
    assert f"finished {STEPS} steps" in logs
    assert_console_is_progress_eval_and_summary_only(logs, out)
    run_dir = out / "job-test"
    final = json.loads((run_dir / "final_metrics.json").read_text())
    assert final["steps"] == STEPS and final["run_dir"] == str(run_dir)
    assert [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl") if "train/loss" in r] == list(
        range(1, STEPS + 1)
    )
    assert list(run_dir.glob("checkpoint_*")), "checkpoints written by path, outside the working dir"


def assert_console_is_progress_eval_and_summary_only(console: str, out) -> None:
    assert re.search(rf"^run job-test: d3 schedule, {STEPS} steps, in .*runs/job-test", console, re.M), console[-3000:]
    assert f"step 2/{STEPS} | loss" in console and f"step {STEPS}/{STEPS} | loss" in console
    assert f"eval step {STEPS} | mean loss" in console
    assert re.search(rf"^schedule: {STEPS // 2} chunks decided, \d+ fallbacks, trainer wait", console, re.M)
    # d3ray's own noise, whatever the cluster: the driver's E-level line about the coordinator's arguments,
    # DeepSpeed's op-build prints, Ray's token-authentication notice (what the cluster's processes print,
    # Ray Train's controller and Ray Data, follows the environment `ray start` gave them)
    for noise in ("Warning:", "Reporting training result", "metrics={", "Traceback", "loss_type=None",
                  "'ScheduleCoordinator' and ID", "built successfully", "Token authentication"):
        assert noise not in console, f"{noise!r} on the console:\n{console[-3000:]}"
    logs = out / "job-test" / "logs"
    assert {"driver.log", "coordinator.log", "trainer-0.log", "trainer-1.log"} <= {p.name for p in logs.iterdir()}
    # the no-argument D3: the trainers score each next chunk themselves (placement: in_trainer), no actor
    rows = [json.loads(line) for line in (out / "job-test" / "schedule_log.jsonl").read_text().splitlines()]
    assert {r["influence_placement"] for r in rows} == {"in_trainer"} and not (logs / "influence-0.log").exists()
    assert "FutureWarning" in (logs / "trainer-0.log").read_text(), "library warnings are kept in the run's logs"
