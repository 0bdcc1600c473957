"""The shared trunk: its plan (a trunk per seed, stopped at the branch point; every arm starting from its
checkpoint) and the branch checkpoint (the trunk's state with a fresh scheduler's schedule state)."""

from __future__ import annotations

import json

import pytest

from d3ray.config_loading import ConfigError, from_dict, load_config
from d3ray.lab.compare.config import CompareConfig
from d3ray.lab.compare.plan import build_plan
from d3ray.lab.compare.trunk import BRANCH_DIR, branch_checkpoint, branch_schedule_state

ARMS = [{"name": "random", "set": {"schedule.type": "random"}},
        {"name": "aa", "set": {"schedule.type": "random", "schedule.order_seed": 1}},
        {"name": "reverse", "set": {"schedule.order_transform": "reverse"}},
        {"name": "loss-select", "set": {"schedule": {"type": "loss", "fraction": 0.5}}}]


def compare_config(tmp_path, trunk_steps, arms=ARMS):
    return from_dict(CompareConfig, {
        "base_config": "jobs/configs/tiny.yaml", "set": {"train.steps": 32}, "seeds": [0, 1],
        "output_dir": str(tmp_path / "cmp"), "arms": arms, "trunk": {"steps": trunk_steps},
        "aa_arm": "aa" if any(a["name"] == "aa" for a in arms) else None})


def test_plan_trunk_per_seed_stops_at_branch_point_and_arms_start_from_it(tmp_path):
    plan = build_plan(compare_config(tmp_path, 16))
    trunk = plan.trunks[1]
    assert trunk.name == "trunk-s1" and trunk.run_dir == tmp_path / "cmp" / "trunks" / "trunk-s1"
    assert trunk.config.schedule.type_name == "random" and trunk.config.seed == 1
    assert (trunk.config.train.steps, trunk.config.train.stop_at_step) == (32, 16)  # the LR schedule of 32 steps
    runs = {r.name: r for r in plan.runs}
    assert runs["reverse-s0"].config.train.init_checkpoint == str(tmp_path / "cmp" / "runs" / "reverse-s0" / BRANCH_DIR)
    assert runs["reverse-s0"].config.train.stop_at_step == 0
    assert plan.same_stream == {"random": True, "aa": True, "reverse": True, "loss-select": False}  # a wider window


@pytest.mark.parametrize("steps,match", [(12, "multiple of schedule.L=8"), (32, r"trunk.steps=32 must be in \(0, ")])
def test_plan_trunk_off_chunk_boundary_or_past_the_end_is_an_error_naming_trunk_steps(tmp_path, steps, match):
    with pytest.raises(ConfigError, match=match):
        build_plan(compare_config(tmp_path, steps))


def test_plan_arm_setting_a_trunk_key_is_refused(tmp_path):
    arms = [*ARMS[:1], {"name": "sneaky", "set": {"train.init_checkpoint": "/x"}}]
    with pytest.raises(ConfigError, match="set by the comparison's trunk"):
        build_plan(compare_config(tmp_path, 16, arms))


def test_compare_config_aa_arm_must_be_another_arm():
    with pytest.raises(ValueError, match="aa_arm='random'"):
        from_dict(CompareConfig, {"arms": ARMS[:2], "aa_arm": "random"})


def test_compare_config_an_arms_control_must_be_another_arm_and_is_dropped_with_it(tmp_path):
    with pytest.raises(ValueError, match="arm 'reverse': control='nope' must be another arm"):
        from_dict(CompareConfig, {"arms": [*ARMS[:2], {**ARMS[2], "control": "nope"}]})
    with pytest.raises(ValueError, match="arm 'aa': control='aa'"):
        from_dict(CompareConfig, {"arms": [ARMS[0], {**ARMS[1], "control": "aa"}]})
    cfg = compare_config(tmp_path, 16, [*ARMS[:2], {**ARMS[2], "control": "aa"}])
    assert cfg.only_arms(["random", "reverse"]).arms[1].control is None  # its control not run: no pairing
    assert cfg.only_arms(["random", "aa", "reverse"]).arms[2].control == "aa"


def test_only_arms_keeps_the_named_arms_and_the_plan_runs_only_them(tmp_path):
    cfg = compare_config(tmp_path, 16)
    subset = cfg.only_arms(["reverse", "random"])
    assert [a.name for a in subset.arms] == ["random", "reverse"] and subset.aa_arm is None  # the file's order
    assert cfg.only_arms(["random", "aa"]).aa_arm == "aa"
    plan = build_plan(subset)
    assert sorted(r.name for r in plan.runs) == ["random-s0", "random-s1", "reverse-s0", "reverse-s1"]
    assert plan.runs[0].run_dir == build_plan(cfg).runs[0].run_dir  # the same directories: a later run skips them
    with pytest.raises(ConfigError, match="baseline arm 'random'"):
        cfg.only_arms(["reverse"])
    with pytest.raises(ConfigError, match=r"\['nope'\] not in this file's arms"):
        cfg.only_arms(["random", "nope"])


def test_compare_command_only_arms_and_the_arms_override_side_by_side(tmp_path, capsys):
    from d3ray.cli import main

    config = "jobs/configs/compare_pretrain_tiny_vr.yaml"
    assert main(["compare", "--config", config, "--dry-run", f"--output_dir={tmp_path}",
                 "--only-arms", "random,d3", "--seeds=[0]"]) == 0
    planned = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert planned == ["trunk-s0", "random-s0", "d3-s0"]
    assert main(["compare", "--config", config, "--dry-run", f"--output_dir={tmp_path}", "--seeds=[0]",
                 "--aa_arm=null", "--arms=[{name: random, set: {schedule.type: random}}]"]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == ["trunk-s0", "random-s0"]
    assert main(["compare", "--config", config, "--dry-run", "--only-arms", "d3"]) == 2


def test_branch_schedule_state_drops_the_trunks_decisions_and_keeps_the_cursor_only_for_the_same_stream():
    trunk = {"decisions": {"2": {"order": [1, 0]}}, "weights_versions": {"2": 1}, "observed_through": 1,
             "scheduler": {"x": 1}, "data_cursor": {"chunk_id": 2, "cursor": {"shard": 0, "offset": 77}}}
    assert branch_schedule_state(trunk, 2, keep_cursor=True) == {
        "branch_at": 2, "data_cursor": {"chunk_id": 2, "cursor": {"shard": 0, "offset": 77}}}
    assert branch_schedule_state(trunk, 2, keep_cursor=False) == {
        "branch_at": 2, "data_cursor": {"chunk_id": 2, "cursor": None}}


def test_branch_checkpoint_links_deepspeed_and_rewrites_schedule_state(tmp_path):
    trunk = tmp_path / "trunk-s0"
    for name, step in (("checkpoint_a", 8), ("checkpoint_b", 16)):
        ckpt = trunk / name
        (ckpt / "deepspeed" / "ds").mkdir(parents=True)
        (ckpt / "model.json").write_text("{}")
        (ckpt / "state.json").write_text(json.dumps({
            "step": step, "next_chunk": step // 8, "position": 0, "tokens": 10 * step,
            "schedule": {"decisions": {"2": {"order": [0]}}, "data_cursor": {"chunk_id": step // 8, "cursor": {"o": 1}}}}))
    target = branch_checkpoint(trunk, 16, tmp_path / "arm" / BRANCH_DIR, keep_cursor=False, L=8)
    state = json.loads((target / "state.json").read_text())
    assert (state["step"], state["tokens"]) == (16, 160)
    assert state["schedule"] == {"branch_at": 2, "data_cursor": {"chunk_id": 2, "cursor": None}}
    assert (target / "deepspeed").is_symlink() and (target / "deepspeed").resolve() == (trunk / "checkpoint_b" / "deepspeed")
    with pytest.raises(ConfigError, match="no checkpoint at step 24"):
        branch_checkpoint(trunk, 24, tmp_path / "other" / BRANCH_DIR, keep_cursor=True, L=8)


def test_shipped_variance_reduced_config_plans_every_arm_from_a_trunk(tmp_path):
    cfg = load_config(CompareConfig, "jobs/configs/compare_pretrain_tiny_vr.yaml", [f"--output_dir={tmp_path}"])
    plan = build_plan(cfg)
    assert all(r.config is not None for r in plan.runs), [r.error for r in plan.runs if r.error]
    assert len(cfg.seeds) >= 6 and set(plan.trunks) == set(cfg.seeds)
    assert cfg.report.metric != "final" and cfg.aa_arm is not None
    arms = {r.arm: r.config for r in plan.runs}
    assert arms["d3-reverse"].schedule.order_transform == "reverse"
    assert arms["d3-alternate"].schedule.order_transform == "alternate"
    assert all(c.train.min_lr_ratio == 0.0 for c in arms.values())
    assert {"mtl", "odm", "doremi", "regmix", "loss-reweight", "d3-oracle", "d3-paper"} <= set(arms)
    paper = arms["d3-paper"]
    assert (paper.schedule.L, paper.schedule.influence.preconditioner, paper.schedule.influence.sketch.k) == (60, "none", 3500)
    assert "paper-faithful" in next(a.label for a in cfg.arms if a.name == "d3-paper")
