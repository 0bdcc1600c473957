"""ODM end to end on the real RedPajama sample (../shared/data), with the shipped config's model, data and
chunking (jobs/configs/redpajama_sample.yaml: seven domains, L = 8, 200 steps by default).

The trainers' per-sample losses reach the mixer (chunk c's record counts the chunks it observed: c − 1 at
staleness 1) and the mixture leaves uniform within the first 10% of the config's run: chunk 2, steps
17 to 24, drawn at the paper's t = 17 after the feedback of chunk 0. Three chunks on one trainer with a
small final eval keep it short; the long run's figures are in docs/results/schedule-odm-real-sample-2026-12-02.md ("ODM on the
real sample").
"""

from __future__ import annotations

import numpy as np
import pytest

from d3ray.config import RunConfig
from d3ray.config_loading import load_config
from d3ray.run_files import read_jsonl
from tests.conftest import REPO, shared_data

pytestmark = [pytest.mark.ray, pytest.mark.slow]

CONFIG = REPO / "jobs" / "configs" / "redpajama_sample.yaml"


def test_odm_real_sample_feedback_reaches_the_mixer_and_the_mixture_leaves_uniform_in_the_first_tenth(
        ray_cluster, tmp_path) -> None:
    from d3ray.run.pretrain import run_pretrain

    sample = shared_data("redpajama_sample", "slimpajama_format")
    shipped = load_config(RunConfig, CONFIG)
    L = shipped.schedule.L
    cfg = load_config(RunConfig, CONFIG, [
        f"--data.train_paths=[{sample / 'train'}]", f"--data.validation_paths=[{sample / 'validation'}]",
        "--eval.ood_text_paths=[]", "--eval.max_sequences_per_domain=2", "--train.eval_every=0",
        "--train.num_workers=1", "--train.checkpoint_every_chunks=100", f"--train.steps={3 * L}",
        f"--output_dir={tmp_path}", "--schedule.type=odm"])
    final = run_pretrain(cfg)
    assert final["steps"] == 3 * L and np.isfinite(final["final_loss"])
    schedule = read_jsonl(cfg.run_dir / "schedule_log.jsonl")
    assert [r["chunk_id"] for r in schedule] == [0, 1, 2] and not any(r["fallback"] for r in schedule)
    assert [r["odm_updates"] for r in schedule] == [0, 0, 1]  # staleness 1: chunk c after the feedback of c − 2
    assert [r["odm_t"] for r in schedule] == [1, 1 + L, 1 + 2 * L]
    domains = sorted(schedule[0]["mixture"])
    assert len(domains) == 7
    assert all(r > 0 for r in schedule[2]["odm_reward"].values()), "every domain's loss reached the mixer"
    for r in schedule[:2]:  # no feedback yet (and ε_t = 1/K): uniform
        assert all(abs(w - 1 / 7) < 1e-12 for w in r["mixture"].values())
    moved = max(abs(w - 1 / 7) for w in schedule[2]["mixture"].values())
    assert moved > 1e-3, schedule[2]["mixture"]
    assert 2 * L < 0.1 * shipped.train.steps  # chunk 2 starts within the first 10% of the shipped run
