"""`d3ray finetune` end to end on a real local Ray: SFT records with response-only loss, full and LoRA,
killed after a checkpoint and resumed: the resumed run trains the same samples with the same losses
as an uninterrupted one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from d3ray.config import RunConfig
from d3ray.config_loading import load_config
from d3ray.faults import FaultPlan, write_plan
from d3ray.run_files import read_jsonl

pytestmark = [pytest.mark.ray, pytest.mark.slow]

STEPS = 6


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    from d3ray.data.skills import write_sft_suite

    return write_sft_suite(tmp_path_factory.mktemp("suite"), seed=1, train_per_skill=40, test_per_skill=8)


@pytest.fixture(scope="module")
def lora_base(tmp_path_factory):
    """A local HF model directory (the tiny preset, random weights, its own tokenizer): the frozen base
    that ``model.pretrained_path`` names in the LoRA runs."""
    from d3ray.data.config import TokenizerConfig
    from d3ray.data.tokenizer import load_tokenizer, train_tokenizer_from_texts
    from d3ray.model import ModelConfig, build_model, model_config_dict

    root = tmp_path_factory.mktemp("base") / "tiny-base"
    texts = [f"{a} plus {b} is {a + b}; copy the word {w}" for a in range(40) for b in range(5) for w in ("cat", "sky")]
    tokenizer = load_tokenizer(train_tokenizer_from_texts(texts, TokenizerConfig(vocab_size=300), root))
    build_model(model_config_dict(ModelConfig(), len(tokenizer), 64, tokenizer.eos_token_id), ModelConfig()
                ).save_pretrained(str(root))
    return root


def sft_config(suite, out, name: str, *extra: str) -> RunConfig:
    return load_config(RunConfig, None, [
        f"--name={name}", f"--output_dir={out}", f"--sft={{paths: [{suite / 'train'}], seq_len: 48}}",
        f"--eval.sft_paths=[{suite / 'test'}]", "--eval.max_sequences_per_domain=4",
        "--data.seq_len=48", "--data.tokenizer.vocab_size=300", f"--train.steps={STEPS}",
        "--train.global_batch_size=4", "--train.micro_batch_size=4", "--train.num_workers=1",
        "--train.warmup_steps=2", "--train.eval_every=0", "--schedule.type=random", "--schedule.L=2",
        *extra,
    ])


def losses(run_dir) -> dict[int, float]:
    return {r["step"]: r["train/loss"] for r in read_jsonl(run_dir / "metrics.jsonl") if "train/loss" in r}


def trained(run_dir) -> list[str]:
    return [s for r in read_jsonl(run_dir / "samples.jsonl") if "sample_ids" in r for s in r["sample_ids"]]


@pytest.mark.parametrize("variant, extra", [
    # (a full model's kill-and-resume: tests/integration/test_pretrain.py, saved in place, the default)
    # LoRA on a local base, ordered by D3: the influence actor builds the same adapters and sketches only
    # them; the checkpoints (uploaded asynchronously) hold the adapters only
    ("lora", ["--train.checkpoint_upload=async", "--train.zero_stage=2", "--model.lora={r: 4}", "--schedule.type=d3", "--schedule.influence.sketch.k=64",
              "--schedule.influence.sample_fraction=0.5", "--schedule.placement={type: actors, nice: 19}"]),
])
def test_finetune_killed_and_resumed_matches_the_uninterrupted_run(ray_cluster, suite, lora_base, tmp_path, variant,
                                                                   extra):
    from ray.train import WorkerGroupError

    from d3ray.run.pretrain import run_pretrain

    if variant == "lora":
        extra = [*extra, f"--model.pretrained_path={lora_base}"]

    reference = sft_config(suite, tmp_path, f"{variant}-ref", *extra)
    final = run_pretrain(reference)
    assert final["steps"] == STEPS
    assert {k for k in final if k.startswith("eval/") and k.endswith("/loss")} >= {"eval/add/loss", "eval/copy/loss"}
    tasks = {d for r in read_jsonl(reference.run_dir / "samples.jsonl") if "domains" in r for d in r["domains"]}
    assert tasks <= {"copy", "add1", "add", "mul", "sort", "reverse", "word"}, "the task is the domain"

    crashed = sft_config(suite, tmp_path, f"{variant}-crash", "--train.max_failures=0", *extra)
    write_plan(crashed.run_dir, FaultPlan(trainer_exit_at_step=5))  # checkpoints after steps 2 and 4
    with pytest.raises(WorkerGroupError):
        run_pretrain(crashed)
    (crashed.run_dir / "faults.json").unlink()
    resumed = run_pretrain(sft_config(suite, tmp_path, f"{variant}-crash", *extra))
    assert resumed["steps"] == STEPS
    assert trained(crashed.run_dir) == trained(reference.run_dir)
    ref, again = losses(reference.run_dir), losses(crashed.run_dir)
    assert sorted(again) == list(range(1, STEPS + 1))
    np.testing.assert_allclose([again[s] for s in sorted(ref)], [ref[s] for s in sorted(ref)], rtol=1e-5, atol=1e-6)
    # The run directory's latest pointer names the checkpoint the run ended on.
    assert (crashed.run_dir / "latest").read_text().strip() == Path(resumed["checkpoint"]).name
    if variant == "lora":
        assert_lora_run_ordered_by_d3_on_adapters(reference, final, lora_base)


def assert_lora_run_ordered_by_d3_on_adapters(reference: RunConfig, final: dict, base: Path) -> None:
    """D3 ordered every chunk with an influence actor that sketched the adapters only, and only the
    adapters trained."""
    from d3ray.export.load import load_model

    schedule = read_jsonl(reference.run_dir / "schedule_log.jsonl")
    assert len(schedule) == STEPS // 2 and not any(r["fallback"] for r in schedule), "D3 ordered every chunk"
    named = list(load_model(final["checkpoint"]).model.named_parameters())
    adapters = [n for n, _ in named if "lora_" in n]
    influence_log = (reference.run_dir / "logs" / "influence-0.log").read_text()
    assert f"{len(adapters)} of {len(named)} parameter tensors" in influence_log, "influence sketches the adapters only"
    assert_only_adapters_trained(final["checkpoint"], base)


def assert_only_adapters_trained(checkpoint: str, base: Path) -> None:
    """LoRA: the checkpoint holds no base weight (they are read back from ``base``), the base weights are
    still the base's and the adapters' B matrices, initialised to zero, have moved."""
    import json

    import torch
    import transformers

    from d3ray.export import deepspeed_state_dict
    from d3ray.export.load import load_model

    assert json.loads((Path(checkpoint) / "model.json").read_text())["base_model"] == str(base)
    assert all("lora_" in name for name in deepspeed_state_dict(Path(checkpoint) / "deepspeed"))
    loaded = load_model(checkpoint)
    assert loaded.is_lora
    initial = transformers.AutoModelForCausalLM.from_pretrained(str(base), local_files_only=True).state_dict()
    after = {n.replace("base_model.model.", "").replace(".base_layer", ""): p
             for n, p in loaded.model.state_dict().items() if "lora_" not in n}
    assert set(after) == set(initial)
    assert all(torch.equal(after[n], initial[n]) for n in initial), "a base weight moved"
    moved = [p for n, p in loaded.model.state_dict().items() if "lora_B" in n]
    assert moved and all(p.abs().sum() > 0 for p in moved), "the adapters did not train"


def test_finetune_default_runs_d3_on_the_generated_suite_with_exact_match(ray_cluster, tmp_path, capsys) -> None:
    """The embedded default (D3 order, the skill suite, exact match at the end), shortened."""
    import json

    from d3ray.cli import main

    assert main(["finetune", f"--output_dir={tmp_path}", "--train.steps=8", "--schedule.L=4",
                 "--train.num_workers=1", "--eval.max_sequences_per_domain=4"]) == 0
    run_dir = tmp_path / "d3ray-sft-tiny"
    final = json.loads((run_dir / "final_metrics.json").read_text())
    assert final["steps"] == 8 and final["schedule/chunks"] == 2 and final["schedule/fallbacks"] == 0
    skills = {"copy", "add1", "add", "mul", "sort", "reverse", "word"}
    assert {f"eval/{s}/loss" for s in skills} <= set(final), "per-task response loss on the held-out split"
    exact = [k for k in final if k.endswith("/exact_match")]
    assert exact and all(0.0 <= final[k] <= 1.0 for k in exact)
    out = capsys.readouterr().out
    assert "schedule: 2 chunks decided" in out
    # The run's end names its checkpoint, and the run directory itself stands for its newest checkpoint.
    assert f"checkpoint: {final['checkpoint']}" in out.splitlines()
    assert main(["export", str(run_dir), "--out", str(tmp_path / "hf")]) == 0
    assert f"exporting its newest checkpoint {final['checkpoint']}" in capsys.readouterr().out
    assert (tmp_path / "hf" / "model.safetensors").is_file()
