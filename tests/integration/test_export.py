"""Export round trip: real DeepSpeed engines (ZeRO 0, 3; LoRA under ZeRO 2) save d3ray checkpoints;
the exported HF directory gives the engine's own logits through AutoModelForCausalLM."""

import json

import pytest
import torch

from d3ray.cli import main
from d3ray.data.config import TokenizerConfig
from d3ray.data.tokenizer import train_tokenizer_from_texts
from d3ray.export import export_model, load_model, model_source_kind
from d3ray.lora import LoraConfig, apply_lora
from d3ray.train.checkpoint import TrainState, save_checkpoint


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    texts = [f"{a}+{b}={a + b}" for a in range(30) for b in range(30)]
    return train_tokenizer_from_texts(texts, TokenizerConfig(vocab_size=300), tmp_path_factory.mktemp("t") / "tok")


def trained_checkpoint(tmp_path, tokenizer_dir, stage: int, lora: bool):
    """Train 2 real DeepSpeed steps, save a d3ray checkpoint; return (dir, input ids, engine logits)."""
    import deepspeed
    import transformers

    torch.manual_seed(stage)
    config = transformers.AutoConfig.for_model(
        "gpt2", n_layer=2, n_head=2, n_embd=32, n_positions=32, vocab_size=300, bos_token_id=0, eos_token_id=0
    )
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
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
    save_checkpoint(engine, TrainState(step=2), directory, rank=0, tokenizer_dir=tokenizer_dir)
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


def test_export_unknown_source_names_what_it_needs(tmp_path):
    (tmp_path / "junk").mkdir()
    with pytest.raises(FileNotFoundError, match="not a d3ray checkpoint .*model.json"):
        export_model(tmp_path / "junk", tmp_path / "out")
    assert not (tmp_path / "out").exists()
