"""The D3 pipeline end to end on a real local Ray: influence actors and a solver pool one chunk
ahead of two DeepSpeed trainers, with bad data and faults. Every run must keep exactly-once:
the multiset of trained sample ids equals that of the chunks produced, and each chunk's batches
are trained in the logged order.
"""

from __future__ import annotations

import json
import re

import pytest

from d3ray.config import RunConfig
from d3ray.config_loading import load_config
from d3ray.faults import FaultPlan, marker, write_plan
from d3ray.run_files import read_jsonl
from tests.accounting import assert_exactly_once_in_logged_order, produce_chunks
from tests.conftest import start_local_ray

pytestmark = [pytest.mark.ray, pytest.mark.slow]

STEPS, L, B = 16, 4, 8
BAD_LINES = [2, 5]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Generated corpus plus one shard with malformed lines; a shared tokenizer. Small enough (~10 global
    batches per epoch) that every run crosses the data epoch boundary."""
    from d3ray.data.config import DataConfig
    from d3ray.data.sample import write_sample_corpus
    from d3ray.data.shards import list_shards
    from d3ray.data.tokenizer import ensure_tokenizer

    root = tmp_path_factory.mktemp("d3corpus")
    write_sample_corpus(root / "data", seed=2, train_docs=30, validation_docs=70, train_shards=2)
    good = {"text": "a clean line of sample text about data order " * 8, "meta": {"redpajama_set_name": "RedPajamaC4"}}
    lines = [json.dumps(good)] * 8
    for n in BAD_LINES:
        lines[n - 1] = '{"text": "broken json'  # malformed JSON
    (root / "data" / "train" / "chunk1" / "00_bad.jsonl").write_text("\n".join(lines) + "\n")
    data = DataConfig(train_paths=[str(root / "data" / "train")], seq_len=64)
    tokenizer = ensure_tokenizer(data, list_shards(data.train_paths), root)
    return root / "data", tokenizer


def d3_config(corpus, out, name, *extra) -> RunConfig:
    data_dir, tokenizer = corpus
    return load_config(RunConfig, None, [
        f"--name={name}", f"--output_dir={out}",
        f"--data.train_paths=[{data_dir / 'train'}]", f"--data.validation_paths=[{data_dir / 'validation'}]",
        f"--data.tokenizer.path={tokenizer}", "--data.seq_len=64", "--data.max_bad_fraction=0.1",
        # checked from the 20th record on: the bad shard (2 bad of 8, listed first) is a block of its own
        # when one task per shard reads and tokenizes; over the corpus 2 of 38 records are bad
        "--data.min_records_before_check=20",
        f"--train.steps={STEPS}", f"--train.global_batch_size={B}", "--train.micro_batch_size=2",
        "--train.num_workers=2", "--train.zero_stage=2", "--train.eval_every=0", "--train.log_every=8",
        "--eval.max_sequences_per_domain=2",
        "--schedule.type=d3", f"--schedule.L={L}", "--schedule.influence.sketch.k=256",
        "--schedule.influence.sample_fraction=0.5", "--schedule.deadline_s=3600",  # a fallback can only come from a failure, not a slow box
        "--schedule.first_chunk=scored",  # every chunk scored, chunk 0 too (the no-argument run trains it in stream order)
        "--schedule.placement={type: actors, nice: 19}",  # the influence actor (the no-argument run: the trainers score)
        *extra,
    ])


@pytest.fixture(scope="module")
def produced_chunks(corpus, tmp_path_factory):
    """The chunks the coordinator produces for these configs, read independently of any run."""
    start_local_ray()
    return produce_chunks(d3_config(corpus, tmp_path_factory.mktemp("ref"), "ref"), STEPS)


def test_d3_staleness0_zero3_llama_with_bad_shard_and_nan_batch_completes_exactly_once(ray_cluster, corpus, produced_chunks, tmp_path):
    from d3ray.run.pretrain import run_pretrain

    # also the ZeRO-3 path: LLaMA weights gathered (16-bit) on every rank for the snapshots
    cfg = d3_config(corpus, tmp_path, "stale0", "--schedule.staleness=0",
                    "--train.zero_stage=3", "--model.preset=llama-tiny", "--train.activation_checkpointing=true")
    write_plan(cfg.run_dir, FaultPlan(influence_nan_batches=[5]))
    final = run_pretrain(cfg)
    assert final["steps"] == STEPS
    # ZeRO-3: each trainer built the model partitioned (inside zero.Init), never whole: half of every tensor
    from d3ray.model import build_model, model_config_dict

    tensors = len(list(build_model(model_config_dict(cfg.model, 8, 8, 0), cfg.model).parameters()))
    for rank in (0, 1):
        log = (cfg.run_dir / "logs" / f"trainer-{rank}.log").read_text()
        held, total = map(int, re.search(r"rank \d built the model partitioned \(ZeRO-3\): holds (\d+) of (\d+)",
                                         log).groups())
        assert 0 <= held - total / 2 <= tensors, (held, total)  # each tensor's partition: ceil(numel / 2)
    schedule = assert_exactly_once_in_logged_order(cfg.run_dir, produced_chunks, STEPS, L)
    # staleness 0: chunk c was scored at the weights published right after chunk c-1 (version c)
    assert [schedule[c]["weights_version"] for c in sorted(schedule)] == list(range(len(schedule)))
    # ... so the trainers waited for that scoring, and the log says so: the wait happens inside the checkpoint
    # after chunk c-1 (it holds chunk c's decision) and is counted as chunk c's wait (not lost in the checkpoint)
    assert all(schedule[c]["trainer_wait_sec"] >= 0.5 * schedule[c]["influence_sec"] for c in sorted(schedule)[1:])
    assert not any(r["fallback"] for r in schedule.values())
    assert schedule[1]["excluded_batches"] == [5]
    assert all(r["excluded_batches"] == [] for c, r in schedule.items() if c != 1)
    # the default, the potential alone: each chunk is the sort of the influence actor's f, no S, no solver actor
    assert all(r["decided_by"] == "sorted by potential, no search" and not r["search"] for r in schedule.values())
    assert "solver" not in json.loads((cfg.run_dir / "placement.json").read_text())
    quality = json.loads((cfg.run_dir / "data_quality.json").read_text())["data_quality"]
    # each epoch's reader counts the bad lines it reads: epoch 1's may not have reached the bad shard yet
    assert quality["bad_by_reason"] in ({"malformed_json": len(BAD_LINES)}, {"malformed_json": 2 * len(BAD_LINES)})
    bad_shard = next(k for k in quality["first_lines"] if k.endswith("00_bad.jsonl\tmalformed_json"))
    assert quality["first_lines"][bad_shard] == BAD_LINES
    assert all(r["predicted_loss_change_vs_random_nats"] <= 0 for r in schedule.values())
    # the run crossed the data epoch (the next epoch's reader pre-started); each chunk logs the trainers' wait
    epochs = [schedule[c]["epoch"] for c in sorted(schedule)]
    assert epochs == sorted(epochs) and set(epochs) == {0, 1}, epochs
    assert all(r["trainer_wait_sec"] >= 0 for r in schedule.values())
    # each chunk logs the snapshot it was scored at: 16 bits (the default), the weights the ZeRO-3 gather
    # gives plus AdamW m and v, i.e. half of float32's 4 bytes per value
    assert {r["snapshot_dtype"] for r in schedule.values()} == {"bfloat16"}
    assert {r["snapshot_bytes"] for r in schedule.values()} == {2 * snapshot_values(cfg, corpus[1])}


def snapshot_values(cfg: RunConfig, tokenizer_dir) -> int:
    """Numbers in one snapshot of the run's model with the AdamW state: the state dict, and m and v of
    every trainable parameter (counted independently of the trainers, from a freshly built model)."""
    from d3ray.data.tokenizer import load_tokenizer
    from d3ray.model import build_model, model_config_dict

    tokenizer = load_tokenizer(str(tokenizer_dir))
    model = build_model(model_config_dict(cfg.model, len(tokenizer), cfg.data.seq_len, tokenizer.eos_token_id), cfg.model)
    weights = sum(t.numel() for t in model.state_dict().values())
    return weights + 2 * sum(p.numel() for p in model.parameters() if p.requires_grad)


def test_d3_influence_solver_and_trainer_failures_in_one_run_complete_exactly_once(
        ray_cluster, corpus, produced_chunks, tmp_path):
    """Three drills at separate points of one run (staleness 1): the actor that orders exits while solving
    chunk 1 (with the default estimator the influence actor orders: ``ActorsPlacement.sorts_in_actor``), the
    influence actor while scoring chunk 2, and a trainer worker at step 14 (chunk 3), rolled back to its
    last checkpoint by Ray Train."""
    from d3ray.run.pretrain import run_pretrain

    cfg = d3_config(corpus, tmp_path, "faults", "--train.max_failures=1")
    write_plan(cfg.run_dir, FaultPlan(solver_exit_at_chunk=1, influence_exit_at_chunk=2, trainer_exit_at_step=14))
    final = run_pretrain(cfg)
    assert final["steps"] == STEPS
    for drill in ("solver_exit_at_chunk_1", "influence_exit_at_chunk_2", "trainer_exit_at_step_14"):
        assert marker(cfg.run_dir, drill).exists(), f"the drill {drill} did fire"
    schedule = assert_exactly_once_in_logged_order(cfg.run_dir, produced_chunks, STEPS, L)
    # staleness 1: chunk c scored at the weights published when chunk c-1 started (version c-1)
    assert [schedule[c]["weights_version"] for c in sorted(schedule)] == [0] + list(range(len(schedule) - 1))
    assert not any(r["fallback"] for r in schedule.values()), "retried tasks on restarted actors made every order"
    assert len(read_jsonl(cfg.run_dir / "schedule_log.jsonl")) == len(schedule), "rolled back, no duplicates"


def test_d3_in_trainer_sharded_influence_survives_a_trainer_killed_while_scoring(
        ray_cluster, corpus, produced_chunks, tmp_path):
    """placement in_trainer under ZeRO-3: the two trainers sketch each next chunk on their
    parameter shards (no influence actors, no weights snapshots). Trainer rank 0 is killed while
    sketching chunk 3 (after the checkpoint after chunk 1: the trainers' own scoring comes after the save);
    Ray Train rolls both back to their last registered checkpoint (after chunk 1, or after chunk 0 when the
    kill beat Ray Train's registration of chunk 1's: then chunk 1's decision comes back from that checkpoint, logged with
    its record) and the run completes exactly once, every chunk ordered (no fallback), the masked batch
    excluded by the sharded path, and only the chunk's S (a few hundred bytes) shipped per chunk."""
    from d3ray.run.pretrain import run_pretrain

    cfg = d3_config(corpus, tmp_path, "in_trainer", "--schedule.placement={type: in_trainer}",
                    "--train.zero_stage=3", "--train.max_failures=1")
    write_plan(cfg.run_dir, FaultPlan(trainer_exit_while_scoring_chunk=3, influence_nan_batches=[5]))
    final = run_pretrain(cfg)
    assert final["steps"] == STEPS
    assert marker(cfg.run_dir, "trainer_exit_while_scoring_chunk_3").exists(), "the drill did fire"
    schedule = assert_exactly_once_in_logged_order(cfg.run_dir, produced_chunks, STEPS, L)
    assert [schedule[c]["weights_version"] for c in sorted(schedule)] == [0] + list(range(len(schedule) - 1))
    assert not any(r["fallback"] for r in schedule.values())
    assert all(r["influence_placement"] == "in_trainer" for r in schedule.values())
    assert schedule[1]["excluded_batches"] == [5] and all(schedule[c]["excluded_batches"] == [] for c in (0, 2, 3))
    assert all(r["predicted_loss_change_vs_random_nats"] <= 0 for r in schedule.values())
    assert all(r["decided_by"] == "sorted by potential, no search" for r in schedule.values())
    assert json.loads((cfg.run_dir / "placement.json").read_text())["influence"] == []  # no influence actors
    # What leaves the trainers per chunk: its potential f (L float64, the potential alone: no S) and the batch
    # losses: nothing that grows with the model or k. Under 1% of a float32 full-weight snapshot.
    assert {r["influence_bytes"] for r in schedule.values()} == {L * 8 + L * 8}
    from d3ray.data.tokenizer import load_tokenizer
    from d3ray.model import ModelConfig, build_model, model_config_dict

    model = build_model(model_config_dict(ModelConfig(), len(load_tokenizer(corpus[1])), 64, 0), ModelConfig())
    assert L * 8 + L * 8 <= 0.01 * 4 * sum(p.numel() for p in model.parameters())
