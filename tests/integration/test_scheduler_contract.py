"""The scheduler contract, for every registered scheduler, on a real local Ray.

1. A short real run (tiny GPT-2, one DeepSpeed worker) completes, logs one decision per chunk, and
   accounts for every sample of every trained chunk: trained, or skipped with a reason. One scheduler
   per way a decision reaches the trainers (a run costs ~25 s; the suite has a 20-minute budget):
   an order from model work (d3: test_d3_pipeline.py, test_finetune.py), a selection scored by an actor
   towards held-out targets (less; nice is replayed below, on held-out SFT prompts), in-step loss
   weights (loss_reweight) and a mixture from feedback against a reference model actor (doremi; odm's
   feedback loop is replayed below). The mixer's run also loses a trainer in its second chunk: rolled
   back to the checkpoint after the first, it trains the samples the logged mixtures draw, each exactly once.
2. Decisions are deterministic and survive a restart: a fresh coordinator and a freshly built
   scheduler, restored from ``checkpoint_state`` at chunk k, decide chunks k.. exactly as the
   uninterrupted coordinator did (the trainers' side, weights snapshots and per-sample feedback,
   is replayed from deterministic values, so the decisions depend on the versions they are given);
   for a mixer, the chunks are drawn with the same mixtures (``Chunk.mixture``) and hold the same samples.
   The pure, Ray-free schedulers (random, sequential, mtl, loss_reweight) are checked without a
   coordinator in tests/unit/test_stateless_schedulers.py.
3. Every scheduler in SFT (``d3ray finetune``), the task as the domain: each decides two chunks of the
   generated skill suite's chunk stream on a coordinator, without a fallback, every sample accounted for;
   a mixer's chunks are drawn from its per-task lanes with the mixture they carry, each sample of a task
   epoch drawn once.

Mixers mix two of the corpus' domains here, two of the suite's tasks in SFT (two per-domain streams start,
not seven); DoReMi's reference is a fresh model directory and RegMix fits a given proxy table (their
pre-runs, a reference run and the proxy runs, are not run by this file). The other schedulers are
replayed over the corpus' packed sequences read once through the Ray Data reader and served from memory
(``IterableSource``): a Ray Data stream costs seconds to start, the replay starts two per scheduler, and
what is replayed here is the scheduler, not the reader (whose resume is tests/integration/test_data_stream.py
and test_coordinator_cursor.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib

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
from tests.streams import memory_stream
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
                "--schedule.influence_placement=actors"],
         # bf16 training on the CPU under ZeRO-0, whose AdamW state LESS reads from the snapshot (issue 27)
         "less": ["--schedule.sketch.k=64", "--schedule.max_target_sequences=4", "--train.precision=bf16"],
         "tsds": ["--schedule.max_target_sequences=4"],
         "near": ["--schedule.max_target_sequences=4"],
         # NICE samples from held-out SFT prompts (sft_targets below); the random model rewards nothing,
         # so each prompt's reference stands in (zero_reward=reference): the sampling still runs, seeded
         "nice": ["--schedule.sketch.k=64", "--schedule.max_target_sequences=2", "--schedule.samples=2",
                  "--schedule.max_new_tokens=3", "--schedule.target_sets=[add, copy]",
                  "--schedule.zero_reward=reference"]}
SFT_TARGETS = {"nice"}
"""Selectors whose target must be held-out SFT records: the replay gives them the skill suite's."""
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


@pytest.fixture(scope="module")
def corpus_sequences(corpus) -> list:
    """Every packed sequence of the corpus' first epoch, through the Ray Data reader, once per module."""
    from d3ray.data.config import DataConfig
    from d3ray.data.corpus_source import CorpusSource
    from d3ray.data.shards import list_shards
    from tests.conftest import start_local_ray

    start_local_ray()
    data_dir, tokenizer = corpus
    data = DataConfig(train_paths=[str(data_dir / "train")], seq_len=T)
    reader = CorpusSource(list_shards(data.train_paths), data, str(tokenizer)).reader(0, None, None)
    try:
        return list(reader)
    finally:
        reader.close()


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
    from d3ray.train.run import run_pretrain

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


# ---- 2. determinism and resume, at the coordinator ------------------------------------------------
N_CHUNKS, RESUME_AT = 4, 2


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


def sft_targets(root, tokenizer: str) -> dict:
    """Held-out SFT sets of the skill suite (prompts with references), as a fine-tuning run's driver makes them."""
    from d3ray.data.sft import SftDataConfig
    from d3ray.data.skills import write_sft_suite
    from d3ray.train.prepare import sft_eval_sets

    suite = write_sft_suite(root / "suite", seed=1, train_per_skill=7, test_per_skill=7)
    return sft_eval_sets(SftDataConfig(paths=[str(suite / "train")], seq_len=T), [str(suite / "test")], tokenizer, 4)


@pytest.mark.parametrize("name", REPLAYED)
def test_scheduler_contract_restored_coordinator_decides_like_the_uninterrupted_one(
        ray_cluster, corpus, corpus_sequences, mix_inputs, tmp_path, name):
    from functools import partial

    import torch

    from d3ray.data.chunk_stream import build_chunk_stream
    from d3ray.data.config import DataConfig
    from d3ray.data.evaluation import load_eval_sequences
    from d3ray.data.shards import list_shards
    from d3ray.data.tokenizer import load_tokenizer
    from d3ray.model import ModelConfig, build_model, model_config_dict
    from d3ray.schedule.coordinator import ScheduleCoordinator

    ray = ray_cluster
    cfg = load_config(RunConfig, None, [f"--schedule.type={name}", f"--schedule.L={L}", "--schedule.deadline_s=3600",
                                        *knobs(name, mix_inputs)]).schedule
    data_dir, tokenizer = corpus
    data = DataConfig(train_paths=[str(data_dir / "train")], seq_len=T)
    if mixes(name):  # drawn by domain: the per-domain Ray Data streams
        make_stream = partial(build_chunk_stream, list_shards(data.train_paths), data, str(tokenizer), B,
                              cfg.window_batches(), 0, 0)
    else:
        make_stream = partial(memory_stream, corpus_sequences, B, cfg.window_batches())
    model_cfg = ModelConfig()
    model_config = model_config_dict(model_cfg, len(load_tokenizer(tokenizer)), T, 0)
    torch.manual_seed(0)
    model = build_model(model_config, model_cfg)
    base = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    params = [n for n, _ in model.named_parameters()]
    requests = cfg.trainer_requests()
    snapshot = partial(snapshot_of_version, base, params,
                       optimizer=requests.snapshot is not None and requests.snapshot.optimizer_state)
    held_out = (sft_targets(tmp_path, str(tokenizer)) if name in SFT_TARGETS  # selectors' targets
                else load_eval_sequences([str(data_dir / "validation")], data, str(tokenizer), 4))
    ctx = BuildContext(seed=5, model_config=model_config, model=model_cfg, run_name=f"c-{name}", run_dir=str(tmp_path),
                       batch_size=B, total_chunks=N_CHUNKS, eval_sets=[ray.put(held_out)], tokenizer_dir=str(tokenizer),
                       domains=MIX_DOMAINS if mixes(name) else None)

    def coordinator_of(scheduler):
        return ray.remote(ScheduleCoordinator).options(max_concurrency=16).remote(
            make_stream, scheduler, requests, cfg.prefetch_chunks, cfg.staleness, cfg.deadline_s,
            draws_mixture=cfg.draws_mixture)

    def drive(coordinator, first: int, last: int, checkpoint_at: int | None = None):
        """Act as the trainers for chunks first..last-1; returns the decisions (and a checkpoint)."""
        decisions, state = {}, None
        drawn = {}
        if requests.snapshot is not None:
            ray.get(coordinator.publish_weights.remote(first, [ray.put(p) for p in snapshot(first)]))
        for c in range(first, last):
            chunk = ray.get(coordinator.get_chunk.remote(c), timeout=300)
            decisions[c] = chunk.decision.to_state()
            drawn[c] = (chunk.mixture, chunk.sample_ids)
            if requests.feedback is not None:
                coordinator.feedback.remote(feedback_of(chunk))
            if requests.snapshot is not None:
                ray.get(coordinator.publish_weights.remote(c + 1, [ray.put(p) for p in snapshot(c + 1)]))
            if c + 1 == checkpoint_at:
                ray.get(coordinator.get_chunk.remote(c + 1), timeout=300)  # as the trainers await it
                state = ray.get(coordinator.checkpoint_state.remote(c + 1), timeout=300)
        return decisions, state, drawn

    if mixes(name):  # the pre-run stage of the driver (RegMix fits its table into the run directory)
        from d3ray.schedule.mix.prerun import PreRunContext

        cfg.before_run(PreRunContext(cfg=dataclasses.replace(RunConfig(), output_dir=str(tmp_path.parent),
                                                             name=tmp_path.name), data=data, domains=MIX_DOMAINS,
                                     run=None, export=None))
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
        uninterrupted, state, drawn = drive(first, 0, N_CHUNKS, checkpoint_at=RESUME_AT)
        ray.kill(first)
        second = coordinator_of(second_scheduler)
        cleanup.callback(ray.kill, second)
        ray.get(second.restore.remote(state))
        resumed, _, drawn_again = drive(second, RESUME_AT, N_CHUNKS)
    for c in range(RESUME_AT, N_CHUNKS):
        fresh = {k: v for k, v in resumed[c].items() if k != "fallback"}
        assert fresh == {k: v for k, v in uninterrupted[c].items() if k != "fallback"}, f"chunk {c} differs"
        assert drawn_again[c] == drawn[c], f"chunk {c} was drawn with another mixture or other samples"
    assert not any(d["fallback"] for d in uninterrupted.values())
    if mixes(name):
        assert all(m is not None and drawn_from(m) <= set(MIX_DOMAINS) for m, _ in drawn.values())
    else:
        assert all(m is None for m, _ in drawn.values())


# ---- 3. every scheduler in SFT, the task as the domain --------------------------------------------
SFT_CHUNKS, SFT_T = 2, 48
SKILLS = {"copy", "add1", "add", "mul", "sort", "reverse", "word"}
# random, sequential and loss_reweight decide from the chunk's shape and the seed only (Ray-free, on any
# chunk: tests/unit/test_stateless_schedulers.py); mtl groups by domain, so it is replayed on the tasks.
SFT_REPLAYED = [n for n in SCHEDULERS if n not in STATELESS or n == "mtl"]
SFT_MIX_DOMAINS = ["add", "copy"]


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory):
    """The generated skill suite (small), its tokenizer and per-task held-out sets, prepared once as
    ``d3ray finetune`` prepares them (d3ray/train/prepare.py)."""
    from d3ray.data.skills import write_sft_suite
    from d3ray.train.prepare import load_eval_sets, prepare_data

    root = tmp_path_factory.mktemp("sft_contract")
    suite = write_sft_suite(root / "suite", seed=2, train_per_skill=24, test_per_skill=4)
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


@pytest.mark.parametrize("name", SFT_REPLAYED)
def test_scheduler_contract_every_scheduler_decides_sft_chunks_with_the_task_as_the_domain(
        ray_cluster, sft_run, sft_mix_inputs, tmp_path, name):
    """Every scheduler builds on the SFT chunk stream and decides its chunks, without a fallback, each
    sample trained or skipped with a reason exactly once, the tasks as the domains; a mixer draws them
    from its per-task lanes, each chunk with the mixture it carries, no sample twice in a task epoch."""
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
    scheduler = cfg.build(BuildContext(
        seed=5, model_config=model_config, model=model_cfg, run_name=f"sft-{name}", run_dir=str(tmp_path),
        batch_size=B, total_chunks=SFT_CHUNKS, tokenizer_dir=str(prepared.tokenizer_dir),
        eval_sets=[ray.put(eval_sets)], domains=mix_domains))
    coordinator = ray.remote(ScheduleCoordinator).options(max_concurrency=16).remote(
        make_stream, scheduler, requests, cfg.prefetch_chunks, cfg.staleness, cfg.deadline_s,
        draws_mixture=cfg.draws_mixture)
    mixtures: dict[int, dict[str, float]] = {}  # the mixer's, as each chunk carries it
    # The same chunks, read independently of the coordinator (a mixer's: drawn with the mixtures it logged)
    produced = make_stream(mixture_for_chunk=mixtures.__getitem__) if mixes(name) else make_stream()
    candidate_chunks = iter(produced)
    drawn: list[str] = []
    try:
        if requests.snapshot is not None:
            ray.get(coordinator.publish_weights.remote(0, [ray.put(p) for p in snapshot(0)]))
        for c in range(SFT_CHUNKS):
            chunk = ray.get(coordinator.get_chunk.remote(c), timeout=300)
            if mixes(name):
                assert chunk.decision.record["scheduler"] == name
                assert drawn_from(chunk.mixture) <= set(SFT_MIX_DOMAINS) and abs(sum(chunk.mixture.values()) - 1) < 1e-6
                mixtures[c] = chunk.mixture
            else:
                assert chunk.mixture is None
            candidates = next(candidate_chunks)
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
            if requests.feedback is not None:
                coordinator.feedback.remote(feedback_of(chunk))
            if requests.snapshot is not None:
                ray.get(coordinator.publish_weights.remote(c + 1, [ray.put(p) for p in snapshot(c + 1)]))
    finally:
        produced.close()
        ray.kill(coordinator)
        scheduler.close()
    assert len(drawn) == len(set(drawn)), "no sample twice (the two chunks lie within the first task epoch)"
    if mixes(name):  # 16 draws of 24 records per task: every drawn id is of task epoch 0
        assert {s.split("/", 1)[0] for s in drawn} == {"0"}
