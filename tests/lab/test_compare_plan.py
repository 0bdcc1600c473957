"""The comparison's plan: arms as dotted overrides, type switches that keep the shared fields,
equal training tokens enforced with an error naming the arm and the key, bad arms as failed runs."""

from __future__ import annotations

import dataclasses

import pytest

from d3ray.config_loading import ConfigError, from_dict
from d3ray.lab.compare.config import CompareConfig
from d3ray.lab.compare.plan import build_plan


def compare_config(tmp_path, arms, **extra):
    return from_dict(CompareConfig, {
        "base_config": "jobs/configs/tiny.yaml", "set": {"train.steps": 16, "schedule.shuffle_buffer": 64},
        "seeds": [0, 1], "output_dir": str(tmp_path / "cmp"), "arms": arms, **extra})


def test_plan_type_switch_keeps_shared_schedule_fields_and_names_runs(tmp_path):
    plan = build_plan(compare_config(tmp_path, [
        {"name": "random", "set": {"schedule.type": "random"}},
        {"name": "d3-oracle", "set": {"schedule.influence.estimator": "lookahead", "schedule.influence.gamma": 0.01,
                                      "schedule.placement": {"type": "actors", "nice": 19}}},
        {"name": "loss", "set": {"schedule": {"type": "loss", "fraction": 0.5, "order": {"type": "d3"}}}},
        {"name": "hard", "set": {"schedule.type": "curriculum", "schedule.direction": "hard_to_easy"}},
    ]))
    runs = {r.name: r for r in plan.runs}
    assert list(runs) == ["random-s0", "random-s1", "d3-oracle-s0", "d3-oracle-s1", "loss-s0", "loss-s1",
                          "hard-s0", "hard-s1"]
    random = runs["random-s1"].config
    assert random.schedule.type_name == "random" and random.seed == 1
    assert (random.schedule.L, random.schedule.shuffle_buffer) == (8, 64)  # kept from the D3 base
    assert runs["d3-oracle-s0"].config.schedule.influence.estimator.is_exact_lookahead
    assert runs["loss-s0"].config.schedule.order.type_name == "d3"
    assert runs["hard-s0"].config.schedule.direction == "hard_to_easy"
    assert plan.methods == {"random": False, "d3-oracle": True, "loss": True, "hard": False}
    assert runs["random-s0"].run_dir == tmp_path / "cmp" / "runs" / "random-s0"
    assert all(r.config.train.steps == 16 for r in plan.runs)


@pytest.mark.parametrize("override,key", [
    ({"train.steps": 8}, "train.steps"),
    ({"train": {"global_batch_size": 16, "micro_batch_size": 4}}, "train.global_batch_size"),
    ({"data.seq_len": 64}, "data.seq_len"),
    ({"data.tokenizer.vocab_size": 512}, "data.tokenizer"),
])
def test_plan_arm_changing_training_tokens_is_an_error_naming_arm_and_key(tmp_path, override, key):
    with pytest.raises(ConfigError, match=rf"arm 'short' changes {key}"):
        build_plan(compare_config(tmp_path, [{"name": "random", "set": {"schedule.type": "random"}},
                                             {"name": "short", "set": override}]))


def test_plan_bad_override_becomes_failed_runs_and_per_run_keys_are_refused(tmp_path):
    plan = build_plan(compare_config(tmp_path, [{"name": "random", "set": {"schedule.type": "random"}},
                                                {"name": "bad", "set": {"schedule.nonsense": 1}},
                                                {"name": "typo", "set": {"schedule.type": "d4"}}]))
    bad = [r for r in plan.runs if r.arm in ("bad", "typo")]
    assert len(bad) == 4 and all(r.config is None for r in bad)
    assert "arm 'bad'" in bad[0].error and "schedule.nonsense" in bad[0].error
    assert "d4" in bad[2].error and "random" in bad[2].error  # the known names are listed
    with pytest.raises(ConfigError, match="'seed' is set per run"):
        build_plan(compare_config(tmp_path, [{"name": "random", "set": {"seed": 3}}]))


def test_plan_config_validation_names_the_problem(tmp_path):
    with pytest.raises(ConfigError, match="baseline='random' is not an arm"):
        from_dict(CompareConfig, {"arms": [{"name": "d3"}]})
    with pytest.raises(ConfigError, match="duplicate arm name"):
        from_dict(CompareConfig, {"arms": [{"name": "random"}, {"name": "random"}]})
    with pytest.raises(ConfigError, match="must match"):
        from_dict(CompareConfig, {"arms": [{"name": "a/b"}], "baseline": "a/b"})


def test_plan_finetune_mode_uses_finetune_defaults(tmp_path):
    plan = build_plan(from_dict(CompareConfig, {"mode": "finetune", "seeds": [0], "output_dir": str(tmp_path),
                                                "arms": [{"name": "random", "set": {"schedule.type": "random"}}]}))
    cfg = plan.runs[0].config
    assert cfg.sft is not None and cfg.train.steps == 240 and "{suite}" in cfg.eval.tasks
    assert plan.shared_tokenizer is None  # the suite (and its tokenizer) is generated per run


def test_finished_run_with_another_config_is_refused(tmp_path):
    import yaml

    from d3ray.config_loading import to_dict
    from d3ray.lab.compare.grid import check_unchanged

    plan = build_plan(compare_config(tmp_path, [{"name": "random", "set": {"schedule.type": "random"}}]))
    spec = plan.runs[0]
    spec.run_dir.mkdir(parents=True)
    saved = to_dict(spec.config)
    (spec.run_dir / "config.yaml").write_text(yaml.safe_dump({**saved, "ray": {"address": "auto"}}))
    check_unchanged(spec)  # how Ray was reached does not matter
    saved["train"]["steps"] = 99
    (spec.run_dir / "config.yaml").write_text(yaml.safe_dump(saved))
    with pytest.raises(ConfigError, match=r"run random-s0 .* another config \(train.steps differ\)"):
        check_unchanged(spec)


def test_finished_run_predating_a_key_reads_it_as_the_default(tmp_path, capsys):
    import yaml

    from d3ray.config_loading import to_dict
    from d3ray.lab.compare.grid import check_unchanged

    plan = build_plan(compare_config(tmp_path, [{"name": "random", "set": {"schedule.type": "random"}}]))
    spec = plan.runs[0]
    spec.run_dir.mkdir(parents=True)
    saved = to_dict(spec.config)
    del saved["train"]["min_lr_ratio"]  # written before the key existed
    (spec.run_dir / "config.yaml").write_text(yaml.safe_dump(saved))
    check_unchanged(spec)
    assert "predates train.min_lr_ratio; read as today's defaults" in capsys.readouterr().out
    train = dataclasses.replace(spec.config.train, min_lr_ratio=0.5)  # the plan asks for a non-default value
    with pytest.raises(ConfigError, match=r"train.min_lr_ratio differ"):
        check_unchanged(dataclasses.replace(spec, config=dataclasses.replace(spec.config, train=train)))


def test_plan_switch_to_a_preset_takes_the_presets_values_not_the_old_types_defaults(tmp_path):
    """The no-argument run's D3 (drift potential, in-trainer placement) becoming ``d3_paper`` in an arm gives
    the paper's preset; a value the comparison set (L, staleness) is kept."""
    plan = build_plan(from_dict(CompareConfig, {
        "set": {"train.steps": 120, "schedule.shuffle_buffer": 64}, "seeds": [0], "output_dir": str(tmp_path),
        "baseline": "random", "arms": [{"name": "random", "set": {"schedule.type": "random"}},
                                       {"name": "paper", "set": {"schedule.type": "d3_paper", "schedule.staleness": 0}}]}))
    paper = next(r for r in plan.runs if r.arm == "paper")
    assert paper.error is None
    schedule = paper.config.schedule
    assert (schedule.type_name, schedule.placement.type_name, schedule.solver.type_name) == ("d3_paper", "actors", "rsr")
    assert schedule.influence.estimator.type_name == "hutchinson" and schedule.L == 60
    assert (schedule.staleness, schedule.shuffle_buffer) == (0, 64)
    assert schedule.preset_departures() and "staleness" in " ".join(schedule.preset_departures())
