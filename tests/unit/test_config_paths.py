"""One list of the config's local path fields (``d3ray.config.LOCAL_PATH_FIELDS``), complete, and
:func:`absolute_paths` applying it to every kind of path field (the compare grid and the sweep both call it)."""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from pathlib import Path

from d3ray.config import LOCAL_PATH_FIELDS, RunConfig, absolute_paths
from d3ray.config_loading import from_dict, load_config
from d3ray.registry import ChoiceConfig

#: Field names that hold paths: ``*_path(s)``, ``*_dir``, ``*_file(s)``, a scheduler's ``reference``
#: (a keyword or a model directory) and ``eval.tasks`` (``KIND=FILE,...``).
PATH_NAME = re.compile(r"(^|_)(paths?|dir|files?)$|^reference$|^tasks$")
#: Run-level outputs, placed by the compare grid and the sweep themselves (not input paths).
OUTPUT_FIELDS = {"output_dir", "storage_path"}


def _family(tp: typing.Any) -> tuple[typing.Any, list[type]]:
    """The choice family of a field type (or None) and the dataclasses the field can hold: every
    registered type of a choice family."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        parts = [_family(arg) for arg in typing.get_args(tp)]
        return next((f for f, _ in parts if f is not None), None), [c for _, cs in parts for c in cs]
    if isinstance(tp, type) and issubclass(tp, ChoiceConfig) and ChoiceConfig in tp.__bases__:
        return tp, [tp.lookup(name) for name in tp.known()]
    return None, [tp] if dataclasses.is_dataclass(tp) else []


def path_like_keys(cls: type, prefix: str = "", families: tuple = ()) -> set[str]:
    """Dotted keys of every field, in the whole tree below ``cls``, whose name says it holds paths.

    A choice family is entered at most twice on one path: a mixer's or selector's ``order`` is a
    scheduler of the same family (``schedule.order.reference``), and no config nests deeper.
    """
    keys: set[str] = set()
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        if PATH_NAME.search(f.name) and f.name not in OUTPUT_FIELDS:
            keys.add(key)
        family, subs = _family(hints[f.name])
        if family is not None and families.count(family) >= 2:
            continue
        for sub in subs:
            keys |= path_like_keys(sub, f"{key}.", (*families, family))
    return keys


def test_every_path_field_of_the_config_tree_is_listed():
    found = path_like_keys(RunConfig)
    assert found - set(LOCAL_PATH_FIELDS) == set(), "path fields missing from LOCAL_PATH_FIELDS"
    assert set(LOCAL_PATH_FIELDS) - found == set(), "LOCAL_PATH_FIELDS names keys the config does not have"


def test_absolute_paths_resolves_every_kind_of_path_field(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ref_model").mkdir()
    cfg = load_config(RunConfig, None, [
        "--data.train_paths=[corpus/train, s3://bucket/train]", "--data.tokenizer.path=tok",
        "--eval.sft_paths=[sft/test]", "--eval.tasks=sft={suite}/test,ppl=wiki.raw",
        "--sft={paths: [sft/train]}", "--schedule.type=curriculum", "--schedule.reference=ref_model",
    ])
    out = absolute_paths(cfg)
    here = str(Path(tmp_path).resolve())
    assert out["data"]["train_paths"] == [f"{here}/corpus/train", "s3://bucket/train"]
    assert out["data"]["tokenizer"]["path"] == f"{here}/tok"
    assert out["eval"]["sft_paths"] == [f"{here}/sft/test"]
    assert out["eval"]["tasks"] == f"sft={{suite}}/test,ppl={here}/wiki.raw"
    assert out["sft"]["paths"] == [f"{here}/sft/train"]
    assert out["schedule"]["reference"] == f"{here}/ref_model"
    assert from_dict(RunConfig, out).data.tokenizer.path == f"{here}/tok"


def test_absolute_paths_keeps_keywords_and_unset_fields():
    out = absolute_paths(load_config(RunConfig, None, ["--schedule.type=curriculum"]))
    assert out["schedule"]["reference"] == "current"
    assert out["model"]["pretrained_path"] is None
    assert out["eval"]["tasks"] == ""


def test_sweep_base_makes_sft_paths_absolute(tmp_path, monkeypatch):
    from d3ray.tune.config import SweepConfig
    from d3ray.tune.sweep import load_base

    monkeypatch.chdir(tmp_path)
    (tmp_path / "base.yaml").write_text("sft: {paths: [my_sft/train]}\neval: {sft_paths: [my_sft/test]}\n")
    base = load_base(SweepConfig(name="s", base_config="base.yaml"))
    here = str(Path(tmp_path).resolve())
    assert base["sft"]["paths"] == [f"{here}/my_sft/train"]
    assert base["eval"]["sft_paths"] == [f"{here}/my_sft/test"]


def test_sweep_trials_count_the_streams_reservation_and_auto_tokenizers_become_one(tmp_path, monkeypatch):
    """A trial's data reservation is what the stream asks Ray for (``stream_cpus``: 2 tokenizers of 1 CPU
    and up to 3 read tasks of 0.25), and ``data.tokenize_actors=0`` (size to the cluster) is one per trial:
    trials share the cluster."""
    from d3ray.config import RunConfig
    from d3ray.config_loading import from_dict, load_config
    from d3ray.tune.config import SweepConfig
    from d3ray.tune.sweep import load_base
    from d3ray.tune.trial_resources import trial_resources

    cfg = load_config(RunConfig, None, ["--data.tokenize_actors=2", "--schedule.type=random", "--train.num_workers=1",
                                        "--train.cpus_per_worker=1"])
    assert trial_resources(cfg, driver_cpus=0.5)["CPU"] == 0.5 + 1 + 2 * 1.0 + 3 * 0.25
    monkeypatch.chdir(tmp_path)
    (tmp_path / "base.yaml").write_text("data: {tokenize_actors: 0}\n")
    base = load_base(SweepConfig(name="s", base_config="base.yaml"))
    assert base["data"]["tokenize_actors"] == 1
    assert trial_resources(from_dict(RunConfig, base), driver_cpus=0.5)["CPU"] == trial_resources(
        load_config(RunConfig, None, ["--data.tokenize_actors=1"]), driver_cpus=0.5)["CPU"]
