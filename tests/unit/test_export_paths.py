"""Where export reads from and writes to: a run directory means its newest checkpoint, and an output
directory that d3ray did not write is refused, never wiped."""

import json
from pathlib import Path

import pytest

from d3ray.data.config import TokenizerConfig
from d3ray.data.tokenizer import train_tokenizer_from_texts
from d3ray.errors import DataPathError, UserError
from d3ray.export import export_model, resolve_model_source
from d3ray.run_files import atomic_directory


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory) -> Path:
    """A tiny random GPT-2 saved as a Hugging Face model dir with its tokenizer."""
    import transformers

    root = tmp_path_factory.mktemp("hf") / "model"
    train_tokenizer_from_texts([f"{a} plus {a}" for a in range(50)], TokenizerConfig(vocab_size=300), root)
    config = transformers.AutoConfig.for_model("gpt2", n_layer=1, n_head=2, n_embd=16, n_positions=16, vocab_size=300)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(str(root))
    return root


def test_export_into_a_users_directory_is_refused_and_leaves_it_as_it_was(hf_model, tmp_path):
    mine = tmp_path / "my-project"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match=r"^--out=.*my-project: a non-empty directory d3ray did not write"):
        export_model(hf_model, mine)
    assert [p.name for p in mine.iterdir()] == ["notes.txt"] and (mine / "notes.txt").read_text() == "mine"


def test_export_into_an_empty_dir_then_again_over_its_own_export_succeeds(hf_model, tmp_path):
    out = tmp_path / "hf"
    out.mkdir()
    export_model(hf_model, out)
    assert json.loads((out / "d3ray_export.json").read_text())["source"] == str(hf_model.resolve())
    (out / "stale.txt").write_text("from the previous export")
    export_model(hf_model, out)  # a previous export is replaced whole
    assert (out / "model.safetensors").is_file() and not (out / "stale.txt").exists()


def test_atomic_directory_foreign_target_refused_before_the_block_runs(tmp_path):
    target = tmp_path / "data"
    target.mkdir()
    (target / "keep.bin").write_bytes(b"1")
    ran = []
    with pytest.raises(UserError, match="did not write"), atomic_directory(target, owned_marker="ours.json"):
        ran.append(True)
    assert not ran and (target / "keep.bin").read_bytes() == b"1"
    assert [p.name for p in tmp_path.iterdir()] == ["data"]  # no temporary sibling left


def fake_checkpoint(run_dir: Path, name: str, step: int) -> Path:
    ckpt = run_dir / name
    (ckpt / "deepspeed").mkdir(parents=True)
    (ckpt / "model.json").write_text("{}")
    (ckpt / "state.json").write_text(json.dumps({"step": step}))
    return ckpt


def test_resolve_model_source_run_dir_gives_the_checkpoint_of_the_highest_step(tmp_path):
    run = tmp_path / "runs" / "d3ray-tiny"
    fake_checkpoint(run, "checkpoint_2026-12-02_10-00-00.000001", step=4)
    newest = fake_checkpoint(run, "checkpoint_2026-12-02_10-00-05.000002", step=8)
    fake_checkpoint(run, "checkpoint_2026-12-02_09-59-59.000000", step=2)
    (run / "checkpoint_2026-12-02_10-00-09.000000").mkdir()  # being written: no model.json yet
    assert resolve_model_source(run) == newest
    assert resolve_model_source(newest) == newest  # a checkpoint is itself


def test_resolve_model_source_run_dir_without_checkpoint_says_so(tmp_path):
    run = tmp_path / "runs" / "d3ray-tiny"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("name: d3ray-tiny\n")
    with pytest.raises(DataPathError, match="a run directory without a checkpoint yet"):
        resolve_model_source(run)
    with pytest.raises(DataPathError, match="no such checkpoint, run directory or model directory"):
        resolve_model_source(tmp_path / "runs" / "typo")


def test_resolve_model_source_follows_the_latest_pointer_over_a_newer_half_uploaded_checkpoint(tmp_path):
    """With the asynchronous upload a newer checkpoint may be in storage only in part; the ``latest``
    pointer (moved by the Ray Train controller once a checkpoint is all there) names the one to use."""
    import pyarrow.fs

    from d3ray.train.latest import read_latest, write_latest

    run = tmp_path / "runs" / "d3ray-tiny"
    whole = fake_checkpoint(run, "checkpoint_2026-12-02_10-00-00.000001", step=4)
    fake_checkpoint(run, "checkpoint_2026-12-02_10-00-05.000002", step=8)  # still uploading
    assert read_latest(run) is None
    write_latest(pyarrow.fs.LocalFileSystem(), str(whole))
    assert (run / "latest").read_text() == f"{whole.name}\n" and not (run / ".latest.tmp").exists()
    assert read_latest(run) == whole
    assert resolve_model_source(run) == whole
    # A pointer to a checkpoint that is gone (keep_checkpoints deleted it, or a copied run dir) is ignored.
    (run / "latest").write_text("checkpoint_gone\n")
    assert read_latest(run) is None
    assert resolve_model_source(run).name == "checkpoint_2026-12-02_10-00-05.000002"
