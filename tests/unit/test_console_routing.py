"""What keeps a good run's console to d3ray's own lines: library prints become log lines, the driver's
fd-2 writes (Ray's C++ E-level notices) go to the run's log file, and a local run's workers get no
preemption watcher (whose creation logs an E-level line)."""

from __future__ import annotations

import logging
import os

from d3ray.config import RunConfig
from d3ray.config_loading import load_config
from d3ray.run.cluster import worker_env
from d3ray.run_files import stderr_to_file, stdout_to_log


def test_stdout_to_log_turns_a_library_print_into_info_lines(capsys, caplog) -> None:
    log = logging.getLogger("d3ray.test_console")
    with caplog.at_level(logging.INFO, logger="d3ray.test_console"), stdout_to_log(log):
        print("DeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op built successfully\n")
    print("step 1/2 | loss 1.0")  # after the block: the console again
    assert capsys.readouterr().out == "step 1/2 | loss 1.0\n"
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, "DeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op built successfully")]


def test_stderr_to_file_sends_fd_2_writes_to_the_file_and_restores_it(capfd, tmp_path) -> None:
    log = tmp_path / "logs" / "driver.log"
    log.parent.mkdir()
    log.write_text("earlier\n")
    with stderr_to_file(log):
        os.write(2, b"[2026-12-02 14:19:18,481 E 1 1] core_worker.cc:2465: Actor ... max_restarts > 0.\n")
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "after\n"
    assert log.read_text() == "earlier\n[2026-12-02 14:19:18,481 E 1 1] core_worker.cc:2465: Actor ... max_restarts > 0.\n"


def test_worker_env_turns_the_preemption_watcher_off_on_a_local_instance_only() -> None:
    local = worker_env(load_config(RunConfig, None, []))
    cluster = worker_env(load_config(RunConfig, None, ["--ray.address=auto"]))
    assert local["RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"] == "0"
    assert "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER" not in cluster  # drained nodes exist there


def test_console_handler_is_one_and_follows_the_current_stderr(monkeypatch):
    import io
    import logging
    import sys

    from d3ray.cli import ConsoleHandler, configure_logging

    first = io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    configure_logging("WARNING")
    configure_logging("WARNING")  # main() twice in one process (tests, notebooks): still one console handler
    root = logging.getLogger()
    assert sum(isinstance(h, ConsoleHandler) for h in root.handlers) == 1
    first.close()  # the stream of the moment the handler was made is gone (a finished capture)
    later = io.StringIO()
    monkeypatch.setattr(sys, "stderr", later)
    logging.getLogger("d3ray.test").warning("after the swap %d", 7)
    assert "after the swap 7" in later.getvalue()
    for handler in [h for h in root.handlers if isinstance(h, ConsoleHandler)]:
        root.removeHandler(handler)
