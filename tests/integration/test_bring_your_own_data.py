"""The data README's "Bring your own data" section, run as written: its toy-corpus script (JSONL with the
text under ``content``, parquet, a saved Hugging Face dataset; Alpaca and ShareGPT SFT files), then its
commands: ``data inspect``, a pre-training run end to end on the three formats with the domains taken
from the folders, and each ``finetune`` command's config through data preparation to its sequences."""

from __future__ import annotations

import json
import re
import shlex

import pytest

from d3ray.cli import main, parse_args
from d3ray.config import RunConfig
from d3ray.config_loading import load_config
from tests.conftest import REPO

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
    from d3ray.train.command import FINETUNE_DEFAULTS
    from d3ray.train.prepare import prepare_data

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
