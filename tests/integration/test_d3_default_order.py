"""The default D3 picks the same orders, and trains to the same losses, as it did before its sort left the
solver (issue 50.5): a seeded no-argument run (the default schedule, shrunk to 24 steps of L = 4 on a
generated corpus) against the run recorded in ``fixtures/d3_default_run.json``.

The fixture was recorded from today's main before the change (the order then came from the solver's
potential short-cut on S = η·(f_j − f_i)); ``python -m tests.integration.test_d3_default_order OUT`` records it
again (only when the data pipeline itself changed: the test first checks that the chunks hold the same
sequences, and says so when they do not).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from d3ray.config import RunConfig
from d3ray.config_loading import load_config
from d3ray.run_files import read_jsonl
from tests.conftest import make_corpus, start_local_ray

pytestmark = [pytest.mark.ray, pytest.mark.slow]

FIXTURE = Path(__file__).parent / "fixtures" / "d3_default_run.json"
STEPS, L = 24, 4  # within the corpus's first epoch (a chunk cut short by the epoch's end is not this test's subject)


def default_config(root: Path, data_dir: Path, tokenizer: Path, *extra: str) -> RunConfig:
    """The default schedule (no schedule key given) on the generated corpus ``data_dir``, in ``root / "runs"``."""
    return load_config(RunConfig, None, [
        "--name=default", f"--output_dir={root / 'runs'}", "--seed=3",
        f"--data.train_paths=[{data_dir / 'train'}]", f"--data.validation_paths=[{data_dir / 'validation'}]",
        f"--data.tokenizer.path={tokenizer}", "--data.seq_len=64",
        f"--train.steps={STEPS}", "--train.eval_every=0", "--eval.max_sequences_per_domain=2",
        f"--schedule.L={L}", "--schedule.deadline_s=3600",  # a fallback only from a failure, not a slow box
        *extra,
    ])


def seeded_default_run(root: Path) -> dict:
    """The default run's chunk orders, the sequences of each chunk in stream order, and the loss of every step."""
    cfg = default_config(root, *make_corpus(root, seed=5, train_docs=200, validation_docs=20, train_shards=2))
    from d3ray.run.pretrain import run_pretrain

    start_local_ray()
    run_pretrain(cfg)
    run_dir = cfg.run_dir
    schedule = read_jsonl(run_dir / "schedule_log.jsonl")
    samples = [r for r in read_jsonl(run_dir / "samples.jsonl") if "sample_ids" in r]
    metrics = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r.get("train/loss") is not None
               and r.get("time/step_sec") is not None]
    trained = {}  # chunk -> position -> sample ids, as trained
    for r in samples:
        trained.setdefault(r["chunk_id"], {})[r["position"]] = r["sample_ids"]
    orders = {str(r["chunk_id"]): r["order"] for r in schedule}
    stream = {}
    for cid, order in orders.items():  # position p trained stream batch order[p]
        by_stream = {order[p]: ids for p, ids in trained[int(cid)].items()}
        stream[cid] = [by_stream[b] for b in range(len(order))]
    placement = json.loads((run_dir / "placement.json").read_text())
    return {"orders": orders, "stream_batches": stream,
            "fallbacks": sum(bool(r["fallback"]) for r in schedule),
            "decided_by": [r.get("decided_by") for r in schedule[1:]],  # chunk 0: stream order (first_chunk)
            "predicted": [r.get("predicted_loss_change_vs_random_nats") for r in schedule[1:]],
            "actors": {role: placement.get(role) for role in ("influence", "solver")},
            "losses": [r["train/loss"] for r in sorted(metrics, key=lambda r: r["step"])]}


@pytest.fixture(scope="module")
def default_run(tmp_path_factory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("default-d3")
    return root, seeded_default_run(root)


def test_d3_default_run_picks_the_recorded_orders_and_losses(default_run):
    recorded = json.loads(FIXTURE.read_text())
    _, now = default_run
    assert now["stream_batches"] == recorded["stream_batches"], (
        "the chunks hold other sequences than when the fixture was recorded (the data pipeline changed): "
        "record it again with python -m tests.integration.test_d3_default_order " + str(FIXTURE))
    assert now["fallbacks"] == recorded["fallbacks"] == 0
    assert now["orders"] == recorded["orders"]
    # ... now decided by the sort of the trainers' f in the coordinator: no solver, no actor
    assert set(now["decided_by"]) == {"sorted by potential, no search"}
    assert now["actors"] == {"influence": [], "solver": None}
    assert all(p is not None and p <= 0 for p in now["predicted"])  # the sort puts every positive weight forward
    assert any(o != sorted(o) for o in now["orders"].values())  # the orders are not all stream order
    assert now["losses"] == pytest.approx(recorded["losses"], rel=1e-6, abs=1e-7)


def test_the_finished_run_again_returns_its_metrics_and_another_config_is_refused_leaving_it_as_it_was(default_run):
    """``run_pretrain`` on a directory holding a finished run (d3ray/run/rerun.py): the same config trains
    nothing and returns the stored final metrics; another one is refused naming the keys; neither writes."""
    from d3ray.errors import UserError
    from d3ray.run.pretrain import run_pretrain

    root, _ = default_run
    corpus = root / "data", root / "tokenizer"
    cfg = default_config(root, *corpus)
    kept = {p.name: p.read_bytes() for p in cfg.run_dir.iterdir() if p.is_file()}
    assert {"config.yaml", "final_metrics.json", "metrics.jsonl"} <= kept.keys()
    again = run_pretrain(cfg)
    assert again == json.loads(kept["final_metrics.json"]) and again["steps"] == STEPS
    with pytest.raises(UserError, match=r"holds a run trained with another config \(schedule.type: 'd3' → 'random'"):
        run_pretrain(default_config(root, *corpus, "--schedule.type=random"))
    with pytest.raises(UserError, match=r"train.steps: 24 → 48"):
        run_pretrain(default_config(root, *corpus, "--train.steps=48"))
    assert {p.name: p.read_bytes() for p in cfg.run_dir.iterdir() if p.is_file()} == kept


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        result = seeded_default_run(Path(tmp))
    Path(sys.argv[1]).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({"orders": result["orders"], "losses": result["losses"][:3]}))
