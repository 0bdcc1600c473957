"""The scoring actor records the seconds it works per call (``scoring_log.jsonl``, for compute accounting)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np

from d3ray.model import ModelConfig, model_config_dict
from d3ray.schedule.scoring import ScoringWorker


def test_scoring_worker_logs_busy_seconds_per_call(tmp_path):
    model = ModelConfig()
    worker = ScoringWorker(model_config_dict(model, 64, 8, 0), model, run_dir=str(tmp_path), role="scorer")
    ids = np.random.default_rng(0).integers(1, 64, size=(3, 8)).astype(np.int32)
    batch = SimpleNamespace(input_ids=ids, n_tokens=np.full(3, 8), loss_mask=None)
    weights = [{k: v.detach().numpy() for k, v in worker.model.state_dict().items()}]
    assert worker.losses(weights, [batch, batch]).shape == (6,)
    assert worker.embeddings(weights, [batch]).shape[0] == 3
    lines = [json.loads(line) for line in (tmp_path / "scoring_log.jsonl").read_text().splitlines()]
    assert [(r["call"], r["rows"]) for r in lines] == [("losses", 6), ("embeddings", 3)]
    assert all(r["sec"] > 0 and r["role"] == "scorer" for r in lines)
