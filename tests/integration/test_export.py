"""Export round trip: real DeepSpeed engines (ZeRO 0, 3; LoRA under ZeRO 2) save d3ray checkpoints;
the exported HF directory gives the engine's own logits through AutoModelForCausalLM."""

import json

import pytest
import torch

from d3ray.cli import main
from d3ray.data.config import TokenizerConfig
from d3ray.data.tokenizer import train_tokenizer_from_texts
from d3ray.export import export_model, load_model, model_source_kind
from d3ray.model.lora import LoraConfig, apply_lora
from d3ray.train.checkpoint import TrainState, save_checkpoint


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    texts = [f"{a}+{b}={a + b}" for a in range(30) for b in range(30)]
    return train_tokenizer_from_texts(texts, TokenizerConfig(vocab_size=300), tmp_path_factory.mktemp("t") / "tok")


def trained_checkpoint(tmp_path, tokenizer_dir, stage: int, lora: bool, base_dir=None):
    """Train 2 real DeepSpeed steps, save a d3ray checkpoint; return (dir, input ids, engine logits).

    ``base_dir``: the random base is first saved there as a local HF model (what ``model.pretrained_path``
    names), and the LoRA checkpoint leaves it out."""
    import deepspeed
    import transformers

    torch.manual_seed(stage)
    config = transformers.AutoConfig.for_model(
        "gpt2", n_layer=2, n_head=2, n_embd=32, n_positions=32, vocab_size=300, bos_token_id=0, eos_token_id=0
    )
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    if base_dir is not None:
        model.save_pretrained(str(base_dir))
    if lora:
        model = apply_lora(model, LoraConfig(r=4))
    engine, *_ = deepspeed.initialize(
        model=model,
        model_parameters=[p for p in model.parameters() if p.requires_grad],
        config={"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
                "optimizer": {"type": "AdamW", "params": {"lr": 3e-2, "torch_adam": True}},
                "zero_optimization": {"stage": stage}, "bf16": {"enabled": False}},
    )
    ids = torch.randint(0, 300, (2, 16), generator=torch.Generator().manual_seed(1))
    for _ in range(2):
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
    directory = tmp_path / f"checkpoint_stage{stage}{'_lora' if lora else ''}"
    save_checkpoint(engine, TrainState(step=2), directory, rank=0, tokenizer_dir=tokenizer_dir,
                    base_model=str(base_dir) if base_dir is not None else None)
    if base_dir is not None:  # the same engine's checkpoint with its base, to compare against
        save_checkpoint(engine, TrainState(step=2), directory.with_name(directory.name + "_with_base"), rank=0,
                        tokenizer_dir=tokenizer_dir)
    engine.eval()
    with torch.no_grad():
        logits = engine(input_ids=ids).logits.clone()
    return directory, ids, logits


def hf_logits(path, ids, **kwargs):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, **kwargs).eval()
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.mark.slow
@pytest.mark.parametrize("stage", [0, 3])
def test_export_full_model_same_logits_as_engine(process_group, tokenizer_dir, tmp_path, stage):
    ckpt, ids, engine_logits = trained_checkpoint(tmp_path, tokenizer_dir, stage, lora=False)
    assert model_source_kind(ckpt) == "checkpoint"
    assert main(["export", str(ckpt), "--out", str(tmp_path / "hf")]) == 0
    names = {p.name for p in (tmp_path / "hf").iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    assert torch.equal(hf_logits(tmp_path / "hf", ids, attn_implementation="eager"), engine_logits)
    # What a user gets by default (transformers picks its attention kernel): the same up to fp32 rounding.
    torch.testing.assert_close(hf_logits(tmp_path / "hf", ids), engine_logits)
    # A local HF dir passes through unchanged.
    export_model(tmp_path / "hf", tmp_path / "hf2")
    assert torch.equal(hf_logits(tmp_path / "hf2", ids, attn_implementation="eager"), engine_logits)


@pytest.mark.slow
def test_export_lora_merged_and_adapter_same_logits_as_engine(process_group, tokenizer_dir, tmp_path):
    ckpt, ids, engine_logits = trained_checkpoint(tmp_path, tokenizer_dir, stage=2, lora=True)
    assert json.loads((ckpt / "model.json").read_text())["lora"]["r"] == 4
    loaded = load_model(ckpt)
    assert loaded.is_lora
    with torch.no_grad():
        assert torch.equal(loaded.model(input_ids=ids).logits, engine_logits)
    adapter = export_model(ckpt, tmp_path / "adapter", lora="adapter")
    assert (adapter / "adapter_config.json").is_file() and (adapter / "base" / "config.json").is_file()
    assert torch.equal(hf_logits(adapter, ids, attn_implementation="eager"), engine_logits)
    merged = export_model(ckpt, tmp_path / "merged")
    assert not (merged / "adapter_config.json").exists()
    # W + (alpha/r)·BA is summed once into W: the same function, rounded differently in fp32.
    torch.testing.assert_close(hf_logits(merged, ids, attn_implementation="eager"), engine_logits)


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_lora_checkpoint_without_its_frozen_base_loads_the_base_from_its_directory(process_group, tokenizer_dir,
                                                                                   tmp_path, stage):
    """LoRA on ``model.pretrained_path``: the checkpoint holds the adapters (and their optimizer state)
    only, a fraction of the base's bytes, and loads back to the engine's logits with the base read from
    the directory ``model.json`` names; without that directory it is refused naming it."""
    from d3ray.errors import DataPathError
    from d3ray.export import deepspeed_state_dict

    ckpt, ids, engine_logits = trained_checkpoint(tmp_path, tokenizer_dir, stage, lora=True, base_dir=tmp_path / "base")
    assert json.loads((ckpt / "model.json").read_text())["base_model"] == str(tmp_path / "base")
    saved = deepspeed_state_dict(ckpt / "deepspeed")
    assert saved and all("lora_" in name for name in saved), sorted(saved)[:3]
    with_base = ckpt.with_name(ckpt.name + "_with_base")
    assert not all("lora_" in name for name in deepspeed_state_dict(with_base / "deepspeed"))
    size = {c: sum(f.stat().st_size for f in (c / "deepspeed").rglob("*") if f.is_file()) for c in (ckpt, with_base)}
    print(f"ZeRO-{stage} LoRA checkpoint: {size[ckpt]} bytes without the base, {size[with_base]} with it")
    # Most of the base's bytes are gone (torch.save's shared storages make the difference not exact).
    assert size[with_base] - size[ckpt] >= 0.75 * (tmp_path / "base" / "model.safetensors").stat().st_size
    loaded = load_model(ckpt)
    assert loaded.is_lora
    with torch.no_grad():
        assert torch.equal(loaded.model(input_ids=ids).logits, engine_logits)
    (tmp_path / "base").rename(tmp_path / "moved")
    with pytest.raises(DataPathError, match=f"holds LoRA adapters only; their base model {tmp_path / 'base'} .* is gone"):
        load_model(ckpt)


def test_export_unknown_source_names_what_it_needs(tmp_path):
    (tmp_path / "junk").mkdir()
    with pytest.raises(FileNotFoundError, match="not a d3ray checkpoint .*model.json"):
        export_model(tmp_path / "junk", tmp_path / "out")
    assert not (tmp_path / "out").exists()
