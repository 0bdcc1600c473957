"""SFT per-task lanes (``IterableSource``): what a mixer draws from in ``d3ray finetune``, without Ray.

A lane is the whole SFT stream filtered to one task, deterministic per (epoch, task), resumable by its
state; the ledger counts each epoch of the files once however many lanes read them; the driver's domain
check names the field of a mixture that names an unknown task.
"""

import itertools
import json

import pytest

from d3ray.config import RunConfig
from d3ray.config_loading import ConfigError, load_config
from d3ray.data.chunk_stream import build_chunk_stream
from d3ray.data.chunker import ChunkStream
from d3ray.data.config import TokenizerConfig
from d3ray.data.iterable_source import IterableSource
from d3ray.data.ledger import BadRecordFractionError, BadRecordLedger
from d3ray.data.sft import SftDataConfig, plain_prompt
from d3ray.data.sft_sequences import iter_sft_sequences, sft_task_counts
from d3ray.data.skills import generate_suite
from d3ray.data.tokenizer import load_tokenizer, train_tokenizer_from_texts

TASKS = ("add", "copy", "word")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    suite = generate_suite(seed=0, train_per_skill=40, test_per_skill=0)
    texts = [plain_prompt((("user", r.prompt),)) + r.response for r in suite["train"]]
    out = tmp_path_factory.mktemp("tok") / "tokenizer"
    return load_tokenizer(train_tokenizer_from_texts(texts, TokenizerConfig(vocab_size=300, split_digits=True), out))


def sft_file(path, n: int = 30, bad_at: tuple[int, ...] = (4, 17)) -> str:
    """``n`` records, tasks interleaved (word, add, copy, word, ...), and a malformed line at each of ``bad_at``."""
    lines = []
    for i in range(n):
        if i in bad_at:
            lines.append("{broken")
        task = ("word", "add", "copy")[i % 3]
        lines.append(json.dumps({"prompt": f"{task} {i} =", "response": f"{i * 7 % 100}", "task": task}))
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def source_of(cfg: SftDataConfig, tokenizer, ledger: BadRecordLedger | None = None) -> IterableSource:
    return IterableSource(lambda epoch, task, counts: iter_sft_sequences(cfg, tokenizer, counts, task=task),
                          ledger, domains=lambda: list(sft_task_counts(cfg)))


def ids(sequences) -> list[str]:
    return [s.sample_id for s in sequences]


@pytest.mark.parametrize("batching", ["pad", "pack"])
def test_a_task_lane_is_the_whole_stream_filtered_to_that_task_in_order(tmp_path, tokenizer, batching):
    cfg = SftDataConfig(paths=[sft_file(tmp_path / "d.jsonl")], seq_len=64, batching=batching, max_bad_fraction=0.2)
    source = source_of(cfg, tokenizer)
    assert source.domains == sorted(TASKS)
    whole = list(source.reader(0, None, None))
    for task in TASKS:
        lane = list(source.reader(0, task, None))
        assert lane and {s.domain for s in lane} == {task}
        assert ids(lane) == ids(s for s in whole if s.domain == task)
        assert [s.tokens.tolist() for s in lane] == [s.tokens.tolist() for s in whole if s.domain == task]
        assert ids(source.reader(3, task, None)) == ids(lane), "deterministic per (epoch, task)"
    if batching == "pack":  # packed within the task: fewer rows than records, each row one task's
        assert len(list(source.reader(0, "add", None))) < 10
    with pytest.raises(ValueError, match=r"no lane for domain 'mul'.*\['add', 'copy', 'word'\]"):
        source.reader(0, "mul", None)


def test_a_lane_resumes_from_its_state_where_it_stood(tmp_path, tokenizer):
    cfg = SftDataConfig(paths=[sft_file(tmp_path / "d.jsonl")], seq_len=32, max_bad_fraction=0.2)
    source = source_of(cfg, tokenizer)
    reader = source.reader(1, "copy", None)
    head = [next(reader) for _ in range(4)]
    state = json.loads(json.dumps(reader.state()))
    rest = list(reader)
    resumed = list(source_of(cfg, tokenizer).reader(1, "copy", state))
    assert ids(resumed) == ids(rest) and len(head) + len(rest) == 10


def test_the_ledger_counts_each_record_of_an_epoch_once_whichever_lane_reads_it(tmp_path, tokenizer):
    cfg = SftDataConfig(paths=[sft_file(tmp_path / "d.jsonl")], seq_len=32, max_bad_fraction=0.2,
                        tokenize_batch_size=1)
    ledger = BadRecordLedger()
    source = source_of(cfg, tokenizer, ledger)
    for task in TASKS:  # three lanes read epoch 0 of the same file: one pass is counted
        list(source.reader(0, task, None))
    assert (ledger.total_good, ledger.bad_by_reason()) == (30, {"malformed_json": 2})
    list(source.reader(1, "word", None))  # epoch 1, read whole by the word lane, then by the add lane
    list(source.reader(1, "add", None))
    assert (ledger.total_good, ledger.bad_by_reason()) == (60, {"malformed_json": 4})
    # Epoch 2, read in part: records are counted as far as the furthest lane has read, once.
    add, copy = source.reader(2, "add", None), source.reader(2, "copy", None)
    assert next(add).sample_id.endswith(":2:0") and ledger.total_good == 62  # word 0, add 1
    assert next(copy).sample_id.endswith(":3:0") and ledger.total_good == 63  # and copy 2
    for _ in range(2):  # the add lane reads on past the copy lane: word 3, add 4, (bad), copy 5, word 6, add 7
        next(add)
    assert (ledger.total_good, ledger.total_bad) == (63 + 5, 5)
    plain = BadRecordLedger()
    list(source_of(cfg, tokenizer, plain).reader(0, None, None))
    assert (plain.total_good, plain.bad_by_reason()) == (30, {"malformed_json": 2}), "as one plain read"


def test_every_lane_stops_on_too_many_bad_records_though_the_run_ledger_counts_them_once(tmp_path, tokenizer):
    cfg = SftDataConfig(paths=[sft_file(tmp_path / "d.jsonl", bad_at=(1, 2, 3, 4))], seq_len=32,
                        max_bad_fraction=0.05)
    source = source_of(cfg, tokenizer)
    for task in ("add", "copy"):  # each lane checks what it read, though only the first counts it for the run
        with pytest.raises(BadRecordFractionError, match=r"d\.jsonl: 4 bad of 34 records"):
            list(source.reader(0, task, None))


def test_mixed_sft_chunk_stream_draws_each_task_once_per_task_epoch(tmp_path, tokenizer):
    cfg = SftDataConfig(paths=[sft_file(tmp_path / "d.jsonl", n=12, bad_at=())], seq_len=32)
    tok_dir = tmp_path / "tok"
    tokenizer.save_pretrained(tok_dir)
    mixture = {"add": 0.5, "copy": 0.5}  # word at 0: its lane never opens
    stream = build_chunk_stream([], None, str(tok_dir), 2, 3, 0, 7, sft=cfg, mixture_for_chunk=lambda c: mixture)
    chunks = list(itertools.islice(stream, 4))
    drawn = [(s, d) for c in chunks for b in c.batches for s, d in zip(b.sample_ids, b.domains, strict=True)]
    assert {d for _, d in drawn} <= {"add", "copy"} and all(c.mixture["word"] == 0 for c in chunks)
    assert set(stream.lanes) <= {"add", "copy"}
    for task in ("add", "copy"):  # 4 records per task: sample ids "<task epoch>/<file>:<line>:0"
        mine = [s for s, d in drawn if d == task]
        by_epoch: dict[str, list[str]] = {}
        for s in mine:
            by_epoch.setdefault(s.split("/", 1)[0], []).append(s.split("/", 1)[1])
        complete = [e for e in sorted(by_epoch) if int(e) < int(max(by_epoch))]
        assert complete, f"{task}: at least one task epoch completed in {len(mine)} draws"
        for e in complete:
            assert sorted(by_epoch[e]) == sorted(set(by_epoch[e])) and len(by_epoch[e]) == 4, \
                f"{task} epoch {e}: each record exactly once"
    resumed = build_chunk_stream([], None, str(tok_dir), 2, 3, 0, 7, sft=cfg, cursor=chunks[2].cursor,
                                 mixture_for_chunk=lambda c: mixture)
    again = list(itertools.islice(resumed, 2))
    assert [b.sample_ids for c in again for b in c.batches] == [b.sample_ids for c in chunks[2:] for b in c.batches]


def test_a_shared_reader_over_sft_files_is_refused_naming_the_way_out(tmp_path, tokenizer):
    """SFT readers cannot be shared (no read groups): a mixed stream asked for a shared reader says so at its
    start, instead of failing on the first sequence with an attribute error."""
    cfg = SftDataConfig(paths=[sft_file(tmp_path / "d.jsonl", n=12, bad_at=())], seq_len=32)
    source = source_of(cfg, tokenizer)
    assert source.shared_span_blocks == 0  # the default a ChunkStream takes: a lane per task
    with pytest.raises(TypeError, match="no read groups.*shares_readers is False"):
        _ = source.reader(0, None, None).group
    stream = ChunkStream(source, 2, 3, mixture_for_chunk=lambda c: {"add": 0.5, "copy": 0.5}, shared_span_blocks=2)
    with pytest.raises(ValueError, match=r"span_blocks=2\).*IterableSource.*pass span_blocks=0"):
        next(iter(stream))


def test_a_task_lanes_ledger_is_its_own_and_the_source_stays_the_runs(tmp_path, tokenizer):
    """``with_ledger``: the copy's readers count into the new ledger only; the run's source is untouched."""
    cfg = SftDataConfig(paths=[sft_file(tmp_path / "d.jsonl", n=12, bad_at=(3,))], seq_len=32, max_bad_fraction=0.5)
    run_ledger, lane_ledger = BadRecordLedger(), BadRecordLedger()
    source = source_of(cfg, tokenizer, run_ledger)
    lane_source = source.with_ledger(lane_ledger)
    assert source.ledger is run_ledger and lane_source.ledger is lane_ledger
    assert ids(lane_source.reader(0, None, None)) == ids(source_of(cfg, tokenizer).reader(0, None, None))
    assert lane_ledger.total == 13 and lane_ledger.total_bad == 1 and run_ledger.total == 0
    list(source.reader(1, "add", None))  # the run's task lanes count epoch 1 into the run's ledger ...
    task_ledger = BadRecordLedger()
    list(source.with_ledger(task_ledger).reader(1, "copy", None))  # ... and the copy's into its own, in full
    assert run_ledger.total == 13 and task_ledger.total == 13 and task_ledger.total_bad == 1


def mix_schedule(*overrides: str):
    return load_config(RunConfig, None, list(overrides)).schedule


@pytest.mark.parametrize("overrides,message", [
    (["--schedule.type=static", "--schedule.weights={add: 0.5, mul: 0.5}"],
     r"schedule\.weights: unknown domain\(s\) \['mul'\]; known domains \(the tasks of sft\.paths\): "
     r"\['add', 'copy', 'word'\]"),
    (["--schedule.type=doremi", "--schedule.reference_steps=2", "--schedule.reference_mixture={add: 0.5, nope: 0.5}"],
     r"schedule\.reference_mixture: unknown domain\(s\) \['nope'\]"),
    (["--schedule.type=odm", "--schedule.domains=[add, mul]"], r"schedule\.domains: unknown domain\(s\) \['mul'\]"),
    (["--schedule.type=odm", "--schedule.domains=[add]"],
     r"schedule\.domains: a domain mixer needs a corpus of at least two domains"),
])
def test_sft_mix_domains_errors_name_the_field(tmp_path, overrides, message):
    from d3ray.schedule.mix.domains import resolve_mix_domains

    sft = SftDataConfig(paths=[sft_file(tmp_path / "d.jsonl")], max_bad_fraction=0.2)
    with pytest.raises(ConfigError, match=message):
        resolve_mix_domains(mix_schedule(*overrides), None, [], sft)


def test_sft_mix_domains_are_the_sorted_tasks_and_one_task_is_not_mixable(tmp_path):
    from d3ray.schedule.mix.domains import resolve_mix_domains

    sft = SftDataConfig(paths=[sft_file(tmp_path / "d.jsonl")], max_bad_fraction=0.2)
    assert resolve_mix_domains(mix_schedule("--schedule.type=odm"), None, [], sft) == ["add", "copy", "word"]
    assert resolve_mix_domains(mix_schedule("--schedule.type=static", "--schedule.weights={word: 0.3, add: 0.7}"),
                               None, [], sft) == ["add", "copy", "word"]
    one = tmp_path / "one.jsonl"
    one.write_text("".join(json.dumps({"prompt": f"{i}=", "response": "x"}) + "\n" for i in range(5)))
    with pytest.raises(ConfigError, match=r"schedule\.type: a domain mixer needs a corpus of at least two domains; "
                                          r"this corpus has \['sft'\]"):
        resolve_mix_domains(mix_schedule("--schedule.type=random_mix"), None, [], SftDataConfig(paths=[str(one)]))


def test_a_mixers_pre_runs_train_and_evaluate_on_the_main_runs_sft_files(tmp_path):
    """DoReMi's reference run and RegMix's proxies (run directories of their own) get the main run's
    resolved SFT files, held-out files, eval tasks and tokenizer, not a suite of their own."""
    from d3ray.data.skills import write_sft_suite
    from d3ray.run.prepare import prepare_data
    from d3ray.run.pretrain import pre_run_context
    from d3ray.schedule.mix.domains import resolve_mix_domains
    from d3ray.schedule.mix.prerun import sub_run_config

    cfg = load_config(RunConfig, None, [
        "--name=main", f"--output_dir={tmp_path}", "--sft={seq_len: 48}", "--eval.tasks=sft={suite}/test",
        "--data.tokenizer.vocab_size=300", "--schedule.type=doremi", "--schedule.reference_steps=2"])
    write_sft_suite(cfg.run_dir / "sft_data", seed=0, train_per_skill=6, test_per_skill=2)  # as generated
    prepared = prepare_data(cfg)
    sub = sub_run_config(pre_run_context(cfg, prepared, ["add", "copy"]), "main-doremi-reference",
                         cfg.run_dir / "doremi", 2, {"add": 0.5, "copy": 0.5}, [])
    assert sub.run_dir != cfg.run_dir
    ours = prepare_data(sub)
    assert not (sub.run_dir / "sft_data").exists(), "no suite of its own"
    assert ours.sft.paths == prepared.sft.paths == [str(cfg.run_dir / "sft_data" / "train")]
    assert ours.sft_eval_paths == prepared.sft_eval_paths == [str(cfg.run_dir / "sft_data" / "test")]
    assert ours.eval_tasks == prepared.eval_tasks == f"sft={cfg.run_dir / 'sft_data'}/test"
    assert ours.tokenizer_dir == prepared.tokenizer_dir
    assert resolve_mix_domains(sub.schedule, sub.data, [], ours.sft) == ["add", "copy"]
