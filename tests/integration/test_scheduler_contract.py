"""The scheduler contract, for every registered scheduler, on a real local Ray.

1. A short real run (tiny GPT-2, one DeepSpeed worker) completes, logs one decision per chunk, and
   accounts for every sample of every trained chunk: trained, or skipped with a reason. One scheduler
   per way a decision reaches the trainers (a run costs ~25 s; the suite has a 20-minute budget):
   an order from model work (d3: test_d3_pipeline.py, test_finetune.py), a selection scored by an actor
   towards held-out targets (less; nice is replayed below, on held-out SFT prompts), in-step loss
   weights (loss_reweight) and a mixture from feedback against a reference model actor (doremi; odm's
   feedback loop is replayed below). The mixer's run also loses a trainer in its second chunk: rolled
   back to the checkpoint after the first, it trains the samples the logged mixtures draw, each exactly once.
2. Every scheduler in SFT (``d3ray finetune``), the task as the domain, on a coordinator: it decides the
   chunks of the generated skill suite's chunk stream without a fallback, every sample accounted for (a
   mixer's chunks are drawn from its per-task lanes with the mixture they carry, each sample of a task epoch
   drawn once); and its decisions are deterministic and survive a restart: a fresh coordinator and a freshly
   built scheduler, restored from ``checkpoint_state`` at chunk k, decide chunks k.. exactly as the
   uninterrupted coordinator did (the trainers' side, weights snapshots and per-sample feedback, is replayed
   from deterministic values, so the decisions depend on the versions they are given); a mixer's chunks are
   drawn with the same mixtures (``Chunk.mixture``) and hold the same samples. The pure, Ray-free schedulers
   (random, sequential, loss_reweight) are checked without a coordinator in
   tests/unit/test_stateless_schedulers.py. The replay is on SFT chunks alone: the pre-training chunk stream
   and its resume are the short runs' above and tests/integration/test_data_stream.py's.

Mixers mix two of the corpus' domains in the short run, two of the suite's tasks in the replay (two per-domain
streams start, not seven); DoReMi's reference is a fresh model directory and RegMix fits a given proxy table
(their pre-runs, a reference run and the proxy runs, are not run by this file).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json

import numpy as np
import pytest

from d3ray.config import RunConfig
from d3ray.config_loading import load_config
from d3ray.faults import FaultPlan, marker, write_plan
from d3ray.run_files import read_jsonl
from d3ray.schedule.config import ScheduleConfig
from d3ray.schedule.scheduler import BuildContext, ChunkFeedback, Kind
from tests.accounting import assert_every_sample_accounted, produce_chunks
from tests.conftest import make_corpus
from tests.unit.test_stateless_schedulers import STATELESS

pytestmark = [pytest.mark.ray, pytest.mark.slow]

SCHEDULERS = ScheduleConfig.known()
SHORT_RUNS = ["less", "loss_reweight", "doremi"]  # d3 runs in test_d3_pipeline.py
# Pure, Ray-free schedulers decide as functions of (chunk, seed): tests/unit/test_stateless_schedulers.py
# checks them without a coordinator; every other scheduler is replayed here.
REPLAYED = [n for n in SCHEDULERS if n not in STATELESS]
# Cheap knobs per scheduler (the contract does not depend on them).
# d3 on its influence actor: the replay publishes weights as the trainers would (the no-argument run's
# placement, the trainers scoring themselves, runs end to end in test_pretrain / test_job_submit / test_sweep)
KNOBS = {"d3": ["--schedule.influence.sketch.k=64", "--schedule.influence.sample_fraction=0.5",
                "--schedule.placement={type: actors, nice: 19}"],
         # the paper's pipeline (Hutchinson, plain step, RSR in a solver actor), with a small sketch and search
         "d3_paper": ["--schedule.influence.sketch.k=64", "--schedule.solver.max_iters=200"],
         # bf16 training on the CPU under ZeRO-0, whose AdamW state LESS reads from the snapshot (issue 27)
         "less": ["--schedule.sketch.k=64", "--schedule.max_target_sequences=4", "--train.precision=bf16"],
         "tsds": ["--schedule.max_target_sequences=4"],
         "near": ["--schedule.max_target_sequences=4"],
         # NICE samples from held-out SFT prompts (the suite's, in the replay); the random model rewards nothing,
         # so each prompt's reference stands in (zero_reward=reference): the sampling still runs, seeded
         "nice": ["--schedule.sketch.k=64", "--schedule.max_target_sequences=2", "--schedule.samples=2",
                  "--schedule.max_new_tokens=3", "--schedule.target_sets=[add, copy]",
                  "--schedule.zero_reward=reference"]}
STEPS, L, B, T = 4, 2, 4, 32
MIX_DOMAINS = ["RedPajamaC4", "RedPajamaCommonCrawl"]


def mixes(name: str) -> bool:
    return ScheduleConfig.lookup(name).kind is Kind.MIX


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("contract"), seed=3, train_docs=120, validation_docs=14,
                       train_shards=1, seq_len=T)


@pytest.fixture(scope="module")
def mix_inputs(tmp_path_factory, corpus):
    """A reference model directory (DoReMi) and a proxy table (RegMix) for the mixers' knobs."""
    from d3ray.data.tokenizer import load_tokenizer

    return write_mix_inputs(tmp_path_factory.mktemp("mix_inputs"), len(load_tokenizer(corpus[1])), T, 0, MIX_DOMAINS)


def drawn_from(mixture: dict[str, float]) -> set[str]:
    """The domains a mixture draws from (the stream lists every known domain, the others at 0)."""
    return {d for d, w in mixture.items() if w > 0}


def knobs(name: str, mix_inputs: dict, domains: list[str] = MIX_DOMAINS) -> list[str]:
    mix = [f"--schedule.domains=[{', '.join(domains)}]", *mix_inputs.get(name, [])] if mixes(name) else []
    return [*KNOBS.get(name, []), *mix]


def write_mix_inputs(root, vocab_size: int, seq_len: int, eos_id: int, domains: list[str]) -> dict:
    """A reference model directory (DoReMi) of the given vocabulary and length, and a proxy table (RegMix)
    over ``domains`` (two), as the mixers' knobs."""
    import torch

    from d3ray.model import ModelConfig, build_model, model_config_dict

    model_cfg = ModelConfig()
    torch.manual_seed(1)
    build_model(model_config_dict(model_cfg, vocab_size, seq_len, eos_id), model_cfg).save_pretrained(root / "reference")
    rows = [",".join(f"mix/{d}" for d in domains) + ",target"] + [f"{w},{1 - w},{3 + (w - 0.3) ** 2}"
                                                                 for w in (0.1, 0.3, 0.5, 0.7, 0.9)]
    (root / "proxies.csv").write_text("\n".join(rows) + "\n")
    return {"doremi": [f"--schedule.reference={root / 'reference'}"],
            "regmix": [f"--schedule.proxy_table={root / 'proxies.csv'}"]}


def selects_towards_a_target(scheduler: str) -> bool:
    """Selectors whose target is the run's held-out sets (``target_sets``)."""
    return any(f.name == "target_sets" for f in dataclasses.fields(ScheduleConfig.lookup(scheduler)))


def run_config(corpus, out, name: str, scheduler: str, extra: list[str]) -> RunConfig:
    data_dir, tokenizer = corpus
    validation = [f"--data.validation_paths=[{data_dir / 'validation'}]"] if selects_towards_a_target(scheduler) else []
    return load_config(RunConfig, None, [*validation,
        f"--name={name}", f"--output_dir={out}", f"--data.train_paths=[{data_dir / 'train'}]",
        f"--data.tokenizer.path={tokenizer}", f"--data.seq_len={T}", f"--train.steps={STEPS}",
        f"--train.global_batch_size={B}", f"--train.micro_batch_size={B}", "--train.num_workers=1",
        "--train.zero_stage=0", "--train.eval_every=0", "--train.checkpoint_every_chunks=100",
        f"--schedule.type={scheduler}", f"--schedule.L={L}", "--schedule.deadline_s=3600", *extra,
    ])


@pytest.mark.parametrize("name", SHORT_RUNS)
def test_scheduler_contract_short_run_completes_logs_and_accounts_for_every_sample(
        ray_cluster, corpus, mix_inputs, tmp_path, name) -> None:
    from d3ray.run.pretrain import run_pretrain

    drill = ["--train.max_failures=1", "--train.checkpoint_every_chunks=1"] if mixes(name) else []
    cfg = run_config(corpus, tmp_path, f"contract-{name}", name, [*knobs(name, mix_inputs), *drill])
    if mixes(name):  # a trainer dies in chunk 1: rolled back to the checkpoint after chunk 0, drawn again
        write_plan(cfg.run_dir, FaultPlan(trainer_exit_at_step=L + 1))
    final = run_pretrain(cfg)
    assert final["steps"] == STEPS and np.isfinite(final["final_loss"])
    if mixes(name):
        assert marker(cfg.run_dir, f"trainer_exit_at_step_{L + 1}").exists(), "the drill did fire"
    schedule = read_jsonl(cfg.run_dir / "schedule_log.jsonl")
    assert [r["chunk_id"] for r in schedule] == list(range(STEPS // L))
    assert all(r["scheduler"] == name and r["fallback"] is False for r in schedule), schedule
    mixtures = None
    if mixes(name):  # each chunk's record carries the mixture it was drawn with, over the mixed domains
        mixtures = {r["chunk_id"]: r["mixture"] for r in schedule}
        assert all(drawn_from(m) <= set(MIX_DOMAINS) and abs(sum(m.values()) - 1) < 1e-6 for m in mixtures.values())
    chunks = produce_chunks(cfg, STEPS, mixtures)
    trained, skipped = assert_every_sample_accounted(cfg.run_dir, chunks, STEPS)
    assert sum(trained.values()) == STEPS * B
    kept = cfg.schedule.window_batches() - L
    assert sum(skipped.values()) == kept * B * len(schedule), "a selector skips the rest of its window"
    if not mixes(name):  # no rollback: every chunk the coordinator read was trained (none past the last)
        assert json.loads((cfg.run_dir / "data_quality.json").read_text())["chunks_produced"] == len(schedule)


# ---- 2. every scheduler in SFT, the task as the domain, restored mid-run ---------------------------
N_CHUNKS, RESUME_AT = 4, 2
SFT_T = 48
SKILLS = {"copy", "add1", "add", "mul", "sort", "reverse", "word"}
# random, sequential and loss_reweight decide from the chunk's shape and the seed only (Ray-free, on any
# chunk: tests/unit/test_stateless_schedulers.py); mtl groups by domain, so it is replayed on the tasks.
REPLAYED = [n for n in SCHEDULERS if n not in STATELESS or n == "mtl"]
SFT_MIX_DOMAINS = ["add", "copy"]


def snapshot_of_version(base: dict[str, np.ndarray], params: list[str], version: int, optimizer: bool) -> list:
    """The parts the trainers would publish after ``version`` chunks: weights, and (``optimizer``) an
    AdamW state of the trainable parameters ``params``; deterministic in the version."""
    from d3ray.influence.optimizer import AdamWState

    rng = np.random.default_rng(1000 + version)
    parts: list = [{k: v + 1e-2 * rng.standard_normal(v.shape).astype(v.dtype) for k, v in base.items()}]
    if optimizer:
        m = {k: 1e-3 * rng.standard_normal(base[k].shape).astype(np.float32) for k in params}
        v = {k: (1e-6 * rng.random(base[k].shape) + 1e-8).astype(np.float32) for k in params}
        parts.append(AdamWState(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, step=10 + version,
                                exp_avg=m, exp_avg_sq=v, max_grad_norm=1.0))
    return parts


def feedback_of(chunk) -> ChunkFeedback:
    """Per-sample 'losses' derived from the sample ids: what the trainers would report."""
    ids = tuple(s for ids in chunk.sample_ids for s in ids)
    losses = np.array([int(hashlib.sha256(s.encode()).hexdigest()[:8], 16) / 2**32 * 4 + 1 for s in ids])
    return ChunkFeedback(chunk.chunk_id, ids, tuple(d for ds in chunk.domains for d in ds), losses.astype(np.float32))


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory):
    """The generated skill suite (small), its tokenizer and per-task held-out sets, prepared once as
    ``d3ray finetune`` prepares them (d3ray/run/prepare.py)."""
    from d3ray.data.skills import write_sft_suite
    from d3ray.run.prepare import load_eval_sets, prepare_data

    root = tmp_path_factory.mktemp("sft_contract")
    suite = write_sft_suite(root / "suite", seed=2, train_per_skill=40, test_per_skill=4)
    cfg = load_config(RunConfig, None, [
        "--name=sft-contract", f"--output_dir={root}", f"--sft={{paths: [{suite / 'train'}], seq_len: {SFT_T}}}",
        f"--eval.sft_paths=[{suite / 'test'}]", "--eval.max_sequences_per_domain=2"])
    prepared = prepare_data(cfg)
    return prepared, load_eval_sets(cfg, prepared)


@pytest.fixture(scope="module")
def sft_mix_inputs(tmp_path_factory, sft_run):
    """The mixers' knobs on the suite's tasks: a reference model of the SFT tokenizer's vocabulary."""
    prepared, _ = sft_run
    return write_mix_inputs(tmp_path_factory.mktemp("sft_mix_inputs"), prepared.vocab_size, SFT_T,
                            prepared.eos_id, SFT_MIX_DOMAINS)


@pytest.mark.parametrize("name", REPLAYED)
def test_scheduler_contract_sft_chunks_decided_and_a_restored_coordinator_decides_like_the_uninterrupted_one(
        ray_cluster, sft_run, sft_mix_inputs, tmp_path, name):
    """Every scheduler builds on the SFT chunk stream and decides its chunks without a fallback, each sample
    trained or skipped with a reason exactly once, the tasks as the domains (a mixer draws them from its
    per-task lanes, each chunk with the mixture it carries, no sample twice in a task epoch); a fresh
    coordinator and scheduler restored at chunk RESUME_AT decide the rest exactly as the uninterrupted ones."""
    from functools import partial

    import torch

    from d3ray.data.chunk_stream import build_chunk_stream
    from d3ray.model import ModelConfig, build_model, model_config_dict
    from d3ray.schedule.coordinator import ScheduleCoordinator
    from d3ray.schedule.mix.domains import resolve_mix_domains

    ray = ray_cluster
    prepared, eval_sets = sft_run
    cfg = load_config(RunConfig, None, [f"--schedule.type={name}", f"--schedule.L={L}", "--schedule.deadline_s=3600",
                                        *knobs(name, sft_mix_inputs, SFT_MIX_DOMAINS)]).schedule
    mix_domains = None
    if mixes(name):  # as the driver does: the tasks resolved and checked, then the pre-run stage
        from d3ray.schedule.mix.prerun import PreRunContext

        mix_domains = resolve_mix_domains(cfg, prepared.data, prepared.train_shards, prepared.sft)
        assert mix_domains == SFT_MIX_DOMAINS
        cfg.before_run(PreRunContext(cfg=dataclasses.replace(RunConfig(), output_dir=str(tmp_path.parent),
                                                             name=tmp_path.name), data=prepared.data,
                                     domains=mix_domains, run=None, export=None))
    make_stream = partial(build_chunk_stream, [], prepared.data, str(prepared.tokenizer_dir), B,
                          cfg.window_batches(), 0, 0, prepared.sft)
    model_cfg = ModelConfig()
    model_config = model_config_dict(model_cfg, prepared.vocab_size, SFT_T, prepared.eos_id)
    torch.manual_seed(0)
    model = build_model(model_config, model_cfg)
    requests = cfg.trainer_requests()
    snapshot = partial(snapshot_of_version, {k: v.detach().float().numpy() for k, v in model.state_dict().items()},
                       [n for n, _ in model.named_parameters()],
                       optimizer=requests.snapshot is not None and requests.snapshot.optimizer_state)
    ctx = BuildContext(seed=5, model_config=model_config, model=model_cfg, run_name=f"sft-{name}", run_dir=str(tmp_path),
                       batch_size=B, total_chunks=N_CHUNKS, tokenizer_dir=str(prepared.tokenizer_dir),
                       eval_sets=[ray.put(eval_sets)], domains=mix_domains)

    def coordinator_of(scheduler):
        return ray.remote(ScheduleCoordinator).options(max_concurrency=16).remote(
            make_stream, scheduler, requests, cfg.prefetch_chunks, cfg.staleness, cfg.deadline_s,
            draws_mixture=cfg.draws_mixture)

    def drive(coordinator, first: int, last: int, checkpoint_at: int | None = None):
        """Act as the trainers for chunks first..last-1; returns the chunks (and a checkpoint)."""
        chunks, state = {}, None
        if requests.snapshot is not None:
            ray.get(coordinator.publish_weights.remote(first, [ray.put(p) for p in snapshot(first)]))
        for c in range(first, last):
            chunks[c] = chunk = ray.get(coordinator.get_chunk.remote(c), timeout=300)
            if requests.feedback is not None:
                coordinator.feedback.remote(feedback_of(chunk))
            if requests.snapshot is not None:
                ray.get(coordinator.publish_weights.remote(c + 1, [ray.put(p) for p in snapshot(c + 1)]))
            if c + 1 == checkpoint_at:
                ray.get(coordinator.get_chunk.remote(c + 1), timeout=300)  # as the trainers await it
                state = ray.get(coordinator.checkpoint_state.remote(c + 1), timeout=300)
        return chunks, state

    with contextlib.ExitStack() as cleanup:  # every actor of both sides goes, whatever fails
        first_scheduler = cfg.build(ctx)
        cleanup.callback(first_scheduler.close)
        # The restored side's scheduler is built now, untouched until the restore: its actors (a process each,
        # ~6 s of imports on a small box) start while the first side decides, not after it (its actors' names
        # are the run's: another name, while the first side's live)
        second_scheduler = cfg.build(dataclasses.replace(ctx, run_name=f"{ctx.run_name}-restored"))
        cleanup.callback(second_scheduler.close)
        first = coordinator_of(first_scheduler)
        cleanup.callback(ray.kill, first)
        uninterrupted, state = drive(first, 0, N_CHUNKS, checkpoint_at=RESUME_AT)
        ray.kill(first)
        second = coordinator_of(second_scheduler)
        cleanup.callback(ray.kill, second)
        ray.get(second.restore.remote(state))
        resumed, _ = drive(second, RESUME_AT, N_CHUNKS)
    for c in range(RESUME_AT, N_CHUNKS):  # what trains (the record holds timings)
        decided = [{k: v for k, v in chunk.decision.to_state().items() if k not in ("fallback", "record")}
                   for chunk in (uninterrupted[c], resumed[c])]
        assert decided[1] == decided[0], f"chunk {c} differs"
        assert (resumed[c].mixture, resumed[c].sample_ids) == (uninterrupted[c].mixture, uninterrupted[c].sample_ids), \
            f"chunk {c} was drawn with another mixture or other samples"

    # The uninterrupted side's chunks against the same chunks read independently of the coordinator (a mixer's:
    # drawn with the mixtures it logged)
    mixtures = {c: chunk.mixture for c, chunk in uninterrupted.items()}
    produced = make_stream(mixture_for_chunk=mixtures.__getitem__) if mixes(name) else make_stream()
    drawn: list[str] = []
    try:
        for (c, chunk), candidates in zip(uninterrupted.items(), produced, strict=False):
            if mixes(name):
                assert chunk.decision.record["scheduler"] == name
                assert drawn_from(chunk.mixture) <= set(SFT_MIX_DOMAINS) and abs(sum(chunk.mixture.values()) - 1) < 1e-6
            else:
                assert chunk.mixture is None
            assert candidates.mixture == chunk.mixture
            assert not chunk.decision.fallback, f"chunk {c}: {chunk.decision.record}"
            assert chunk.steps == L and all(len(ids) == B for ids in chunk.sample_ids)
            trained = [s for ids in chunk.sample_ids for s in ids]
            skipped = [s for ids in chunk.skipped.values() for s in ids]
            assert sorted(trained + skipped) == sorted(s for b in candidates.batches for s in b.sample_ids), \
                f"chunk {c}: every candidate trains or is skipped with a reason, exactly once"
            by_id = {s: d for b in candidates.batches for s, d in zip(b.sample_ids, b.domains, strict=True)}
            assert [d for ds in chunk.domains for d in ds] == [by_id[s] for s in trained], "the task is the domain"
            assert set(by_id.values()) <= (set(SFT_MIX_DOMAINS) if mixes(name) else SKILLS)
            drawn += sorted(by_id)
    finally:
        produced.close()
    assert len(drawn) == len(set(drawn)) == N_CHUNKS * cfg.window_batches() * B, \
        "no sample twice (the chunks lie within the first task epoch)"
    if mixes(name):  # 32 draws of 40 records per task: every drawn id is of task epoch 0
        assert {s.split("/", 1)[0] for s in drawn} == {"0"}
