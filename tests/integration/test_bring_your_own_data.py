"""The data README's "Bring your own data" section, run as written: its toy-corpus script (JSONL with the
text under ``content``, parquet, a saved Hugging Face dataset; Alpaca and ShareGPT SFT files), then its
commands: ``data inspect``, a pre-training run end to end on the three formats with the domains taken
from the folders, and each ``finetune`` command's config through data preparation to its sequences. Then
corpora of ``{"text": ...}`` records alone (JSONL, parquet, a saved dataset; one domain and two), trained
with no flag but their paths, and a folder of every JSON file kind beside a file that is not read."""

from __future__ import annotations

import json
import random
import re
import shlex
from pathlib import Path

import pytest

from d3ray.cli import main, parse_args
from d3ray.config import RunConfig
from d3ray.config_loading import load_config
from tests.conftest import REPO
from tests.unit.test_data_bring_your_own import save_hf_dataset, write_jsonl, write_parquet

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def readme_section() -> tuple[list[str], list[list[str]]]:
    """The section's Python blocks and its ``d3ray ...`` command lines (as argv, without ``d3ray``)."""
    text = (REPO / "d3ray" / "data" / "README.md").read_text()
    section = text.split("\n## Bring your own data", 1)[1].split("\n## ", 1)[0]
    scripts = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    commands = [shlex.split(line)[1:] for block in re.findall(r"```bash\n(.*?)```", section, flags=re.S)
                for line in block.replace("\\\n", " ").splitlines() if line.startswith("d3ray ")]
    return scripts, commands


def test_readme_bring_your_own_data_commands_run_and_a_three_format_corpus_trains(
        ray_cluster, tmp_path, monkeypatch, capsys) -> None:
    from d3ray.data import BadRecordLedger
    from d3ray.data.sft_sequences import iter_sft_sequences, read_sft_records
    from d3ray.run.command import FINETUNE_DEFAULTS
    from d3ray.run.prepare import prepare_data

    scripts, commands = readme_section()
    assert len(scripts) == 1 and [c[0] for c in commands] == ["data", "pretrain", "finetune", "finetune"]
    monkeypatch.chdir(tmp_path)
    exec(compile(scripts[0], "README: Bring your own data", "exec"), {"__name__": "__main__"})

    inspect, pretrain, *finetunes = commands
    capsys.readouterr()
    assert main(inspect) == 0
    table = capsys.readouterr().out
    for shard in ("mydata/web/part-0.jsonl", "mydata/code/part-0.parquet", "mydata/books/data-00000-of-00001.arrow"):
        assert re.search(rf"{re.escape(shard)} +150 +0 ", table), table

    assert main(pretrain) == 0
    run_dir = tmp_path / "runs" / "byo"
    final = json.loads((run_dir / "final_metrics.json").read_text())
    assert final["steps"] == 8 and final["final_loss"] < 20
    quality = json.loads((run_dir / "data_quality.json").read_text())["data_quality"]
    assert quality["total_bad"] == 0 and quality["total_good"] >= 150
    log = (run_dir / "logs" / "driver.log").read_text()
    assert "data.domains: ['books', 'code', 'web'] (data.domains=[]: the folder names" in log
    trained = {row.split(",")[2] for row in (run_dir / "domains.csv").read_text().splitlines()[1:]}
    assert trained and trained <= {"books", "code", "web"}

    for argv, first in zip(finetunes, ((("user", "Add the numbers.\n0 and 3"), ("assistant", "3")),
                                       (("user", "Repeat 0."), ("assistant", "0"))), strict=True):
        args = parse_args(argv)
        cfg = load_config(RunConfig, None, [*FINETUNE_DEFAULTS, *args.overrides])
        prepared = prepare_data(cfg)
        ledger = BadRecordLedger()
        sequences = list(iter_sft_sequences(prepared.sft, prepared.tokenizer_dir, ledger))
        assert ledger.total_good == len(sequences) == 200 and ledger.total_bad == 0
        assert read_sft_records(prepared.sft.paths, fields=prepared.sft.fields())[0].messages == first


# ---- a corpus as a user holds it: no domain field, any format, trained with no data flags (issue 49) --------
WORDS = {"web": "page link site news blog post today read more", "code": "def return class import for if x y",
         "books": "chapter river night said she walked the old house"}


def domain_texts(domain: str, n: int, seed: int = 0) -> list[str]:
    rng = random.Random(f"{domain}{seed}")
    return [" ".join(rng.choice(WORDS[domain].split()) for _ in range(60)) for _ in range(n)]


def write_split(folder: Path, fmt: str, texts: list[str]) -> None:
    """``texts`` as ``{"text": ...}`` records in ``folder``: a JSONL file, a parquet file or a saved dataset."""
    if fmt == "jsonl":
        write_jsonl(folder / "part-0.jsonl", [{"text": t} for t in texts])
    elif fmt == "parquet":
        write_parquet(folder / "part-0.parquet", {"text": texts}, row_group_size=64)
    else:
        save_hf_dataset(folder, {"text": texts})


def run_cli(argv: list[str], capsys) -> tuple[str, str]:
    capsys.readouterr()
    assert main(argv) == 0
    return capsys.readouterr()


# One domain: the data path is itself the corpus (a saved dataset's folder, the layout with the most to get
# wrong: the folder is both the dataset and the domain's name). Several domains: one subfolder each, every
# subfolder in another format, so one run reads all three kinds (the JSONL-only folder of one domain trains in
# the test below; each format's reader, one domain or several, is tested without Ray in
# tests/unit/test_data_corpus_domains.py).
LAYOUTS = {"one_domain": {"train": "save_to_disk"},
           "three_domains_three_formats": {"web": "jsonl", "code": "parquet", "books": "save_to_disk"}}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_plain_text_corpus_trains_with_no_data_flags(ray_cluster, tmp_path, capsys, layout) -> None:
    """``{"text": ...}`` records only: one folder (one domain, named after it) or one subfolder per domain;
    the validation folders pair with them by name (several) or all belong to the one."""
    formats = LAYOUTS[layout]
    train, validation = tmp_path / "corpus" / "train", tmp_path / "corpus" / "validation"
    for d, fmt in formats.items():
        words = "web" if d == "train" else d
        write_split(train / d if len(formats) > 1 else train, fmt, domain_texts(words, 120))
        write_split(validation / d if len(formats) > 1 else validation, fmt, domain_texts(words, 30, seed=1))
    out, _ = run_cli(["pretrain", f"--output_dir={tmp_path / 'runs'}", "--name=plain", f"--data.train_paths=[{train}]",
                      f"--data.validation_paths=[{validation}]", "--train.steps=8", "--schedule.type=random",
                      "--train.num_workers=1"], capsys)  # the data path is the point: one trainer
    names = sorted(formats)
    line = ", ".join(f"{d} (120 records)" for d in names)  # a small corpus: every record read before the run
    assert f"domains: {line}, from the data paths' folder names (the records have no 'meta.redpajama_set_name')" in out
    run_dir = tmp_path / "runs" / "plain"
    final = json.loads((run_dir / "final_metrics.json").read_text())
    assert final["steps"] == 8 and {k for k in final if k.startswith("eval/") and k.endswith("/loss")} == {
        f"eval/{d}/loss" for d in names}
    quality = json.loads((run_dir / "data_quality.json").read_text())["data_quality"]
    assert quality["total_bad"] == 0 and quality["total_good"] >= 120 * len(names)
    trained = {row.split(",")[2] for row in (run_dir / "domains.csv").read_text().splitlines()[1:]}
    assert trained and trained <= set(names)


def test_every_json_file_kind_in_a_folder_trains_and_the_rest_are_named_in_one_warning(ray_cluster, tmp_path,
                                                                                         capsys) -> None:
    """The five files once left out without a word (``.JSONL``, ``.json``, ``.ndjson``, ``.jsonl.bz2``,
    ``.jsonl.zstd``) are read beside the ``.jsonl.zst``; a file of no shard kind is named on the console."""
    import bz2

    import zstandard

    root = tmp_path / "mixed"
    root.mkdir()
    files = {name: domain_texts("web", 5, seed=i) for i, name in enumerate(
        ["a.jsonl.zst", "b.JSONL", "c.json", "d.ndjson", "e.jsonl.bz2", "f.jsonl.zstd"])}
    for name, texts in files.items():
        lines = "".join(json.dumps({"text": t}) + "\n" for t in texts).encode()
        data = {"a.jsonl.zst": zstandard.ZstdCompressor().compress(lines), "c.json": json.dumps(
            [{"text": t} for t in texts]).encode(), "e.jsonl.bz2": bz2.compress(lines),
            "f.jsonl.zstd": zstandard.ZstdCompressor().compress(lines)}.get(name, lines)
        (root / name).write_bytes(data)
    (root / "notes.txt").write_text("not a record file")
    _, err = run_cli(["pretrain", f"--output_dir={tmp_path / 'runs'}", "--name=kinds", f"--data.train_paths=[{root}]",
                      "--train.steps=2", "--schedule.type=random", "--train.num_workers=1"], capsys)
    assert "data.train_paths: 1 file(s) not read, not of a kind d3ray reads (" in err and "mixed/notes.txt" in err
    quality = json.loads((tmp_path / "runs" / "kinds" / "data_quality.json").read_text())["data_quality"]
    # every file read (each epoch of the 30 records counts them again), none of them bad
    assert set(quality["good"]) == {f"mixed/{name}" for name in files} and quality["total_bad"] == 0
    assert all(n % 5 == 0 for n in quality["good"].values())
