"""Discoverability: ``d3ray config show``, ``d3ray schedulers NAME`` and the config sections in ``--help``."""

from __future__ import annotations

import dataclasses
import typing

import pytest
import yaml

from d3ray.cli import main
from d3ray.config import RunConfig
from d3ray.config_docs import field_docs, first_sentence
from d3ray.config_loading import from_dict, load_config, to_dict
from d3ray.registry import ChoiceConfig
from d3ray.run.command import CONFIG_SECTIONS
from d3ray.schedule.config import ScheduleConfig


def test_field_docs_reads_the_string_under_each_field_including_inherited_ones():
    docs = field_docs(ScheduleConfig.lookup("odm"))
    assert docs["L"].startswith("Chunk length: consecutive global batches")  # from ScheduleConfig
    assert docs["alpha"].startswith("Smoothing of the reward estimate")       # the subclass' own


def test_first_sentence_does_not_stop_at_eg_or_et_al():
    assert first_sentence("Extra fields, e.g. ``{n: 4}``; applied. More.") == "Extra fields, e.g. ``{n: 4}``; applied."
    assert first_sentence("As in Xu et al. 2026. Then.") == "As in Xu et al. 2026."


def test_config_show_prints_yaml_that_loads_back_to_the_resolved_config(capsys, tmp_path):
    assert main(["config", "show", "--schedule.L=16", "--train.steps=40"]) == 0
    out = capsys.readouterr().out
    assert "placement:" in out and "type: in_trainer" in out and "# Chunk length" in out
    expected = load_config(RunConfig, None, ["--schedule.L=16", "--train.steps=40"])
    assert from_dict(RunConfig, yaml.safe_load(out)) == expected
    path = tmp_path / "shown.yaml"
    path.write_text(out)
    assert to_dict(load_config(RunConfig, path)) == to_dict(expected)


def test_config_show_bad_key_is_a_one_line_error(capsys):
    assert main(["config", "show", "--train.stepz=3"]) == 2
    assert "train.stepz" in capsys.readouterr().err


def test_schedulers_name_lists_that_schedulers_knobs_with_defaults(capsys):
    assert main(["schedulers", "doremi"]) == 0
    out = capsys.readouterr().out
    knobs = yaml.safe_load(out.split("\n\n", 1)[1])["schedule"]
    names = {f.name for f in dataclasses.fields(ScheduleConfig.lookup("doremi")) if f.init}
    assert set(knobs) == names | {"type"}
    assert knobs["reference_steps"] == 0 and "# Train the reference first" in out


def test_schedulers_unknown_name_lists_known(capsys):
    assert main(["schedulers", "nope"]) == 2
    assert "known:" in capsys.readouterr().err


def test_help_lists_every_config_section(capsys):
    hints = typing.get_type_hints(RunConfig)
    sections = {name for name, tp in hints.items()
                if any(dataclasses.is_dataclass(t) or isinstance(t, type) and issubclass(t, ChoiceConfig)
                       for t in (tp, *typing.get_args(tp)))}
    assert set(CONFIG_SECTIONS) == sections
    with pytest.raises(SystemExit):
        main(["pretrain", "--help"])
    out = capsys.readouterr().out
    assert all(f"\n  {name} " in out for name in sections)
