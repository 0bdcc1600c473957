"""Which checkpoints a census branches from, and the input it refuses (before any Ray or training)."""

from __future__ import annotations

import json

import pytest

from d3ray.config import RunConfig
from d3ray.config_loading import load_config, to_dict
from d3ray.errors import UserError
from d3ray.lab.census.census import CensusOptions, check_inputs, choose_checkpoints, load_run


def test_choose_checkpoints_requested_inside_stream_kept_sorted():
    assert choose_checkpoints([0, 2, 4, 6], whole_chunks=8, chunks=2, persist=0, requested=[4, 2], count=3,
                              warmup=None) == [2, 4]


def test_choose_checkpoints_past_end_or_missing_raise_naming_them():
    with pytest.raises(UserError, match=r"chunks 6\.\.8 .* past the end .*\(chunks 0\.\.7\)"):
        choose_checkpoints([0, 2, 4, 6], whole_chunks=8, chunks=2, persist=1, requested=[6], count=3, warmup=None)
    with pytest.raises(UserError, match=r"no checkpoint at chunk 3 \(it has \[0, 2, 4, 6\]\)"):
        choose_checkpoints([0, 2, 4, 6], whole_chunks=8, chunks=1, persist=0, requested=[3], count=3, warmup=None)


def test_choose_checkpoints_automatic_evenly_spaced_past_warmup():
    # warm-up 8 of 32 chunks (a quarter); the checkpoints that leave 2 chunks: 8, 10, ..., 30 → ends and middle
    available = list(range(0, 33, 2))
    assert choose_checkpoints(available, whole_chunks=32, chunks=2, persist=0, requested=None, count=3,
                              warmup=None) == [8, 20, 30]
    assert choose_checkpoints(available, whole_chunks=32, chunks=2, persist=0, requested=None, count=1,
                              warmup=30) == [30]
    with pytest.raises(UserError, match="no checkpoint at or past chunk 31"):
        choose_checkpoints(available, whole_chunks=32, chunks=2, persist=0, requested=None, count=3, warmup=31)


def write_run(root, overrides, checkpoints):
    cfg = load_config(RunConfig, None, overrides)
    root.mkdir(parents=True)
    import yaml

    (root / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    for i, next_chunk in enumerate(checkpoints):
        d = root / f"checkpoint_{i}"
        d.mkdir()
        (d / "state.json").write_text(json.dumps({"step": next_chunk * cfg.schedule.L, "next_chunk": next_chunk,
                                                  "position": 0, "tokens": 0, "schedule": {}}))
        write_deepspeed_states(d, cfg.train.zero_stage, cfg.train.num_workers)
    return root


def write_deepspeed_states(checkpoint, stage, world, bf16=False, ranks=None):
    """The files DeepSpeed's save_checkpoint writes under ``deepspeed/ds`` (what the census's checks read of
    them: the model states' ``ds_config`` and ``dp_world_size``), for ``ranks`` (default: all ``world``)."""
    import torch

    ds = checkpoint / "deepspeed" / "ds"
    ds.mkdir(parents=True, exist_ok=True)
    states = {"ds_config": {"zero_optimization": {"stage": stage}, "bf16": {"enabled": bf16}}, "dp_world_size": world}
    for r in range(world) if ranks is None else ranks:
        if stage < 3 and r == 0:
            torch.save(states, ds / "mp_rank_00_model_states.pt")
        if stage == 3:
            torch.save(states, ds / f"zero_pp_rank_{r}_mp_rank_00_model_states.pt")
        if stage > 0:
            torch.save({"optimizer_state_dict": {}}, ds / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt")
    return ds


def test_load_run_without_checkpoint_refused_in_one_line(tmp_path):
    run = write_run(tmp_path / "run", ["--schedule.type=random", "--schedule.L=4"], [])
    with pytest.raises(UserError, match="no checkpoint at a chunk boundary"):
        load_run(run)
    with pytest.raises(UserError, match="not a run directory"):
        load_run(tmp_path)


def test_check_inputs_mixer_missing_eval_file_and_large_all_orders_refused_zero2_taken(tmp_path):
    run = write_run(tmp_path / "mix", ["--schedule.type=odm", "--schedule.L=4", "--train.steps=16",
                                       "--train.zero_stage=0"], [1, 2])
    with pytest.raises(UserError, match="schedule.type=odm"):
        check_inputs(load_run(run), CensusOptions(run_dir=run, out=tmp_path / "o"))
    run = write_run(tmp_path / "zero2", ["--schedule.type=random", "--schedule.L=4", "--train.steps=16",
                                         "--train.zero_stage=2"], [1, 2])
    assert check_inputs(load_run(run), CensusOptions(run_dir=run, out=tmp_path / "o", checkpoints=[1])) == [1]
    run = write_run(tmp_path / "rand", ["--schedule.type=random", "--schedule.L=8", "--train.steps=32",
                                        "--train.zero_stage=0"], [1, 2])
    info = load_run(run)
    assert info.whole_chunks == 4 and sorted(info.checkpoints) == [1, 2]
    with pytest.raises(UserError, match="missing.txt: no such file"):
        check_inputs(info, CensusOptions(run_dir=run, out=tmp_path / "o", eval_files=[str(tmp_path / "missing.txt")]))
    with pytest.raises(UserError, match="L <= 5"):
        check_inputs(info, CensusOptions(run_dir=run, out=tmp_path / "o", all_orders=True))
    with pytest.raises(UserError, match="--persist -1 must be >= 0"):
        check_inputs(info, CensusOptions(run_dir=run, out=tmp_path / "o", persist=-1))
    assert check_inputs(info, CensusOptions(run_dir=run, out=tmp_path / "o", checkpoints=[2], chunks=2)) == [2]


def test_a_finished_branch_without_a_read_out_asked_for_now_is_trained_again(tmp_path):
    from d3ray.lab.census.census import lacks_read_outs

    done = {"status": "ok", "eval": {}, "persist_eval": {}}
    opts = CensusOptions(run_dir=tmp_path, out=tmp_path / "o", persist=1)
    assert not lacks_read_outs(done, opts)
    assert lacks_read_outs({"status": "ok", "eval": {}}, CensusOptions(run_dir=tmp_path, out=tmp_path, persist=1))
    assert not lacks_read_outs({"status": "ok", "eval": {}}, CensusOptions(run_dir=tmp_path, out=tmp_path))
    assert not lacks_read_outs({"status": "failed"}, opts)  # its order failed (a non-finite loss): reported as such
    assert lacks_read_outs({"status": "failed", "retry": True}, opts)  # its worker died: trained again


def test_check_trunk_checkpoints_refuses_chunks_the_run_would_not_keep_before_training():
    from d3ray.config_loading import ConfigError
    from d3ray.lab.census.census import check_trunk_checkpoints

    cfg = load_config(RunConfig, "jobs/configs/census_pretrain_tiny.yaml", [])  # 40 chunks, every 10, keep 10
    check_trunk_checkpoints(cfg, [10, 20, 30])
    check_trunk_checkpoints(cfg, None)  # automatic checkpoints: the finished run's own decide
    with pytest.raises(ConfigError, match=r"every 10 chunks of 40: no checkpoint before chunk\(s\) \[15, 40\]"):
        check_trunk_checkpoints(cfg, [10, 15, 40])
    few = load_config(RunConfig, "jobs/configs/census_pretrain_tiny.yaml", ["--train.keep_checkpoints=2"])
    with pytest.raises(ConfigError, match=r"keeps its last 2 checkpoints \(chunks \[30, 40\]\).*keep_checkpoints=4"):
        check_trunk_checkpoints(few, [10, 30])
    by_steps = load_config(RunConfig, "jobs/configs/census_pretrain_tiny.yaml", ["--train.checkpoint_every_steps=64"])
    check_trunk_checkpoints(by_steps, [15])  # counted in steps: load_run checks the run's own after training


def test_census_command_takes_a_run_dir_or_a_config_never_both(tmp_path, capsys):
    import yaml

    from d3ray.cli import main
    from d3ray.config_loading import to_dict

    assert main(["census", "--out", str(tmp_path / "o")]) == 2
    assert main(["census", str(tmp_path), "--config", "jobs/configs/census_pretrain_tiny.yaml",
                 "--out", str(tmp_path / "o")]) == 2
    assert main(["census", str(tmp_path), "--out", str(tmp_path / "o"), "--train.steps=8"]) == 2
    # --config with a chunk the run does not checkpoint: refused before anything trains
    assert main(["census", "--config", "jobs/configs/census_pretrain_tiny.yaml", f"--output_dir={tmp_path}",
                 "--out", str(tmp_path / "o"), "--checkpoints", "15"]) == 2
    assert not (tmp_path / "census-pretrain-tiny").exists()
    # --config whose run directory holds a run finished with another config: refused (not branched as if it
    # were the config's run), nothing written there
    other = load_config(RunConfig, "jobs/configs/census_pretrain_tiny.yaml", [f"--output_dir={tmp_path}",
                                                                               "--train.steps=160"])
    (other.run_dir / "checkpoint_2026-12-06_00-00-00.000000").mkdir(parents=True)
    (other.run_dir / "config.yaml").write_text(yaml.safe_dump(to_dict(other)))
    (other.run_dir / "final_metrics.json").write_text('{"steps": 160}')
    capsys.readouterr()
    assert main(["census", "--config", "jobs/configs/census_pretrain_tiny.yaml", f"--output_dir={tmp_path}",
                 "--out", str(tmp_path / "o"), "--checkpoints", "10"]) == 2
    assert "holds a run trained with another config (train.steps: 160 → 320)" in capsys.readouterr().err
    assert sorted(p.name for p in other.run_dir.iterdir()) == [
        "checkpoint_2026-12-06_00-00-00.000000", "config.yaml", "final_metrics.json"]


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_a_checkpoint_the_census_cannot_restore_is_refused_naming_it_and_what_is_missing(tmp_path, stage):
    from d3ray.lab.census.restore import check_checkpoint

    good = tmp_path / "good"
    write_deepspeed_states(good, stage, 2)
    layout = check_checkpoint(good)
    assert (layout.stage, layout.world_size, layout.bf16) == (stage, 2, False)

    lost = tmp_path / "lost"  # rank 1 never wrote its shards
    write_deepspeed_states(lost, stage, 2, ranks=[0])
    what = r"optimizer shard of rank\(s\) 1 of the 2 ranks that wrote it is" if stage < 3 else "ZeRO-3 shards"
    with pytest.raises(UserError, match=rf"checkpoint {lost} cannot be restored: the {what}.* missing .*"
                                        r"zero_pp_rank_1_mp_rank_00_optim_states\.pt"):
        check_checkpoint(lost)
    bf16 = tmp_path / "bf16"  # no fp32 master weights to merge into the census's fp32 engine
    write_deepspeed_states(bf16, stage, 2, bf16=True)
    with pytest.raises(UserError, match=rf"checkpoint {bf16} was written at ZeRO-{stage} in bf16"):
        check_checkpoint(bf16)


def test_a_checkpoint_without_model_states_or_deepspeed_state_is_refused_naming_it(tmp_path):
    from d3ray.lab.census.restore import check_checkpoint

    with pytest.raises(UserError, match=rf"checkpoint {tmp_path} has no DeepSpeed state"):
        check_checkpoint(tmp_path)
    (tmp_path / "deepspeed" / "ds").mkdir(parents=True)
    with pytest.raises(UserError, match="has no model states"):
        check_checkpoint(tmp_path)
    (tmp_path / "deepspeed" / "ds" / "mp_rank_00_model_states.pt").write_bytes(b"cut short")
    with pytest.raises(UserError, match="mp_rank_00_model_states.pt is not a readable DeepSpeed model-states file"):
        check_checkpoint(tmp_path)
    assert check_checkpoint(write_deepspeed_states(tmp_path / "zero0", 0, 2).parent.parent).stage == 0
    run = write_run(tmp_path / "run", ["--schedule.type=random", "--schedule.L=4", "--train.steps=16",
                                       "--train.zero_stage=2"], [1, 2])
    (run / "checkpoint_1" / "deepspeed" / "ds" / "zero_pp_rank_0_mp_rank_00_optim_states.pt").unlink()
    with pytest.raises(UserError, match=r"checkpoint_1 cannot be restored: the optimizer shard of rank\(s\) 0 "):
        check_inputs(load_run(run), CensusOptions(run_dir=run, out=tmp_path / "o", checkpoints=[1]))


def test_the_census_counts_whole_chunks_not_the_runs_chunks(tmp_path):
    """A last chunk that train.steps cuts short is one of the run's chunks (``total_chunks``, ⌈steps / L⌉)
    but holds no census window: the census branches only inside ⌊steps / L⌋ whole chunks."""
    from d3ray.data.chunker import total_chunks

    run = write_run(tmp_path / "cut", ["--schedule.type=random", "--schedule.L=8", "--train.steps=30",
                                       "--train.zero_stage=0"], [1, 2])
    info = load_run(run)
    assert info.whole_chunks == 3 and total_chunks(30, 8) == 4
    with pytest.raises(UserError, match=r"chunks 2\.\.3 .* past the end .*\(chunks 0\.\.2\)"):
        choose_checkpoints(sorted(info.checkpoints), info.whole_chunks, chunks=2, persist=0, requested=[2], count=1,
                           warmup=None)
