"""``train.report_to`` (d3ray/train/tracking.py): d3ray's metrics writer feeds a real W&B run (offline mode)
and a real MLflow run (a local file store) through Ray's setup_wandb / setup_mlflow, in this process;
a tracker whose extra is missing stops the run before Ray with one line naming the extra."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import pytest

from d3ray.config import RunConfig
from d3ray.config_loading import ConfigError, load_config
from d3ray.run.preflight import check_environment, environment_problems
from d3ray.train.metrics import RunLogs

ROWS = [
    {"step": 1, "chunk_id": 0, "train/loss": 2.5, "train/lr": 0.1, "train/grad_norm": None},
    {"step": 2, "chunk_id": 0, "train/loss": 2.0, "train/lr": 0.05},
    {"step": 2, "chunk_id": 0, "train/loss/web": 2.25, "data/samples/web": 8},
    {"step": 2, "eval/web/loss": 3.0, "eval/web/ppl": float("inf")},
]


def log_rows(run_dir: Path, report_to: list[str]) -> None:
    logs = RunLogs(run_dir, 0, 0, report_to=report_to, run_name="tracked",
                   config={"train": {"lr": 0.1, "betas": [0.9, 0.95]}, "seed": 3})
    for row in ROWS:
        logs.log_metrics(dict(row))
    logs.close()


def wandb_records(path: Path) -> list:
    """The records of an offline W&B run file (LevelDB-log blocks of wandb Record protobufs)."""
    from wandb.proto import wandb_internal_pb2

    data, records = path.read_bytes(), []
    assert data[:4] == b":W&B"
    pos, payload = 7, b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        length, kind = struct.unpack("<HB", data[pos + 4:pos + 7])
        payload += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST: a whole record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(payload)
            payload = b""
            records.append(record)
    return records


def wandb_history(path: Path, timeout_s: float = 60.0) -> list[dict[str, float]]:
    """The history rows of a finished offline W&B run file. ``run.finish()`` returns once the service has the
    exit record; the service's writer can reach the disk a moment later (seen once under a loaded CI box), so
    the file is read until its exit record is there."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = wandb_records(path)
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    return [{"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in r.history.item}
            for r in records if r.WhichOneof("record_type") == "history"]


def test_tracking_wandb_offline_run_holds_the_logged_rows(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_dir"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    (tmp_path / "wandb_dir").mkdir()
    log_rows(tmp_path / "run", ["tensorboard", "wandb"])
    [run_file] = (tmp_path / "wandb_dir").glob("wandb/offline-run-*/run-*.wandb")
    history = {int(r["_step"]): r for r in wandb_history(run_file)}
    assert sorted(history) == [1, 2]
    assert history[1]["train/loss"] == 2.5 and history[1]["train/lr"] == 0.1
    assert "train/grad_norm" not in history[1]  # None is not plotted
    # the eval row of step 2 joins step 2's training row; a non-finite value is not sent
    assert history[2]["train/loss"] == 2.0 and history[2]["eval/web/loss"] == 3.0 and "eval/web/ppl" not in history[2]
    assert history[2]["train/loss/web"] == 2.25
    assert any((tmp_path / "run" / "tb").iterdir())  # tensorboard still written alongside


def test_tracking_mlflow_file_store_holds_metrics_per_step_and_config(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "d3ray-test")
    log_rows(tmp_path / "run", ["mlflow"])
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("d3ray-test")
    [run] = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "tracked" and run.info.status == "FINISHED"
    history = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "train.loss")]
    assert sorted(history) == [(1, 2.5), (2, 2.0)]
    # "/" is "." in MLflow: its file store could not keep train/loss/web below the file train/loss
    assert run.data.metrics["train.loss.web"] == 2.25 and run.data.metrics["data.samples.web"] == 8
    assert run.data.metrics["eval.web.loss"] == 3.0 and "eval.web.ppl" not in run.data.metrics
    assert run.data.params["train.lr"] == "0.1" and run.data.params["seed"] == "3"
    assert not (tmp_path / "run" / "tb").exists()  # report_to without tensorboard writes no tb/


def test_train_config_report_to_unknown_name_refused():
    with pytest.raises(ConfigError, match=r"train\.report_to=\['tensorboard', 'comet'\].*tensorboard, wandb, mlflow"):
        load_config(RunConfig, None, ["--train.report_to=[tensorboard,comet]"])


def test_preflight_report_to_without_its_extra_names_the_extra():
    cfg = load_config(RunConfig, None, ["--train.report_to=[wandb,mlflow]"])
    problems = environment_problems(cfg, importable=lambda name: name not in ("wandb", "mlflow"))
    assert problems == [
        "train.report_to lists 'wandb', which needs the wandb package: pip install 'd3ray[wandb]' "
        "(or remove wandb from train.report_to)",
        "train.report_to lists 'mlflow', which needs the mlflow package: pip install 'd3ray[mlflow]' "
        "(or remove mlflow from train.report_to)",
    ]
    assert environment_problems(cfg) == []  # the dev install has both extras


def test_preflight_regmix_lightgbm_without_its_extra_raises_one_line():
    cfg = load_config(RunConfig, None, ["--schedule.type=regmix", "--schedule.regressor=lightgbm"])
    problems = environment_problems(cfg, importable=lambda name: name != "lightgbm")
    assert problems == ["schedule.regressor=lightgbm (RegMix) needs the lightgbm package: pip install "
                        "'d3ray[regmix]', or use schedule.regressor=ridge"]
    check_environment(cfg)  # installed here: no error
