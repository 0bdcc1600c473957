"""Any local Hugging Face causal LM: GPT-2, Llama, Qwen2 and Mistral shapes, each a small random-weight
model saved with a tokenizer (nothing downloads here). d3ray builds each from ``model.pretrained_path``
(its weights, forward and loss), LoRA's default targets every linear layer but the LM head, the model's
tokenizer comes with it (read only), a larger tokenizer is refused naming both vocabulary sizes, and
``d3ray export --dtype`` writes bf16 or fp32 safetensors."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
import torch
import transformers

from d3ray.config import RunConfig
from d3ray.data.config import DataConfig, TokenizerConfig
from d3ray.data.sft import SftDataConfig
from d3ray.data.tokenizer import load_tokenizer, train_tokenizer_from_texts
from d3ray.errors import UserError
from d3ray.model import ModelConfig, build_model, model_config_dict
from d3ray.model.lm_loss import sequence_losses, step_loss
from d3ray.model.lora import LoraConfig
from d3ray.run.prepare import prepare_data

SMALL = {"bos_token_id": 0, "eos_token_id": 0, "num_hidden_layers": 2, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4,
         "num_key_value_heads": 2, "max_position_embeddings": 64}
ARCHITECTURES = {
    "gpt2": lambda vocab: transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=64, vocab_size=vocab,
                                                   bos_token_id=0, eos_token_id=0),
    "llama": lambda vocab: transformers.LlamaConfig(vocab_size=vocab, **SMALL),
    "qwen2": lambda vocab: transformers.Qwen2Config(vocab_size=vocab, **SMALL),
    "mistral": lambda vocab: transformers.MistralConfig(vocab_size=vocab, **SMALL),
}
TEXTS = [f"record {i}: the {w} model reads {i * 7} tokens" for i in range(60) for w in ("small", "random", "local")]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    return train_tokenizer_from_texts(TEXTS, TokenizerConfig(vocab_size=300), tmp_path_factory.mktemp("t") / "tok")


def save_model(root: Path, arch: str, vocab: int, tokenizer: Path | None) -> Path:
    """A random-weight ``arch`` model (seed 0) saved in ``root``, with the tokenizer's files if given."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(ARCHITECTURES[arch](vocab))
    model.save_pretrained(str(root))
    if tokenizer is not None:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(tokenizer / name, root / name)
    return root


def sft_run(tmp_path: Path, model_dir: Path, tokenizer_path: str | None = None) -> RunConfig:
    rows = [{"prompt": f"{a}+{a}=", "response": str(2 * a), "task": "add"} for a in range(20)]
    records = tmp_path / "sft" / "train.jsonl"
    records.parent.mkdir(parents=True, exist_ok=True)
    records.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return RunConfig(output_dir=str(tmp_path / "runs"), model=ModelConfig(pretrained_path=str(model_dir)),
                     sft=SftDataConfig(paths=[str(records)], seq_len=32),
                     data=DataConfig(tokenizer=TokenizerConfig(vocab_size=300, path=tokenizer_path)))


def linear_names(model) -> set[str]:
    """Every nn.Linear / GPT-2 Conv1D but the output head, found independently of peft."""
    head = model.get_output_embeddings()
    return {name for name, m in model.named_modules()
            if isinstance(m, (torch.nn.Linear, transformers.pytorch_utils.Conv1D)) and m is not head}


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_build_model_pretrained_architecture_loads_weights_trains_and_lora_adapts_every_linear(arch, tmp_path,
                                                                                                tokenizer_dir):
    model_dir = save_model(tmp_path / arch, arch, 300, tokenizer_dir)
    cfg = ModelConfig(pretrained_path=str(model_dir))
    model = build_model(model_config_dict(cfg, 300, 64, 0), cfg)
    reference = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), attn_implementation="eager").eval()
    ids = torch.tensor([load_tokenizer(model_dir)(TEXTS[3])["input_ids"][:16]])
    labels = torch.cat([ids[:, 1:], torch.full((1, 1), -100)], dim=1)
    model.eval()
    assert torch.equal(model(input_ids=ids).logits, reference(input_ids=ids).logits)  # its weights, not random ones
    sums, counts = sequence_losses(model(input_ids=ids).logits, labels)
    loss = step_loss(sums, counts, None)
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in model.parameters() if p.requires_grad)

    lora = build_model(model_config_dict(cfg, 300, 64, 0), ModelConfig(pretrained_path=str(model_dir), lora=LoraConfig()))
    adapted = {name.removeprefix("base_model.model.") for name, m in lora.named_modules() if hasattr(m, "lora_A")}
    assert adapted == linear_names(reference) and adapted
    trainable = {n for n, p in lora.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)


def test_prepare_pretrained_path_without_tokenizer_path_uses_the_model_tokenizer_read_only(tmp_path, tokenizer_dir):
    model_dir = save_model(tmp_path / "my-llama", "llama", 300, tokenizer_dir)
    before = {p.name: p.read_bytes() for p in model_dir.iterdir()}
    cfg = sft_run(tmp_path, model_dir)
    prepared = prepare_data(cfg)
    assert prepared.tokenizer_dir == model_dir
    assert prepared.vocab_size == len(load_tokenizer(tokenizer_dir))
    assert not (cfg.run_dir / "tokenizer").exists()  # nothing trained
    assert {p.name: p.read_bytes() for p in model_dir.iterdir()} == before  # nothing written into the model dir


@pytest.mark.parametrize("given", ["model_dir", "tokenizer_path"])
def test_prepare_tokenizer_larger_than_pretrained_vocab_is_refused_naming_both_sizes(given, tmp_path, tokenizer_dir):
    model_dir = save_model(tmp_path / "small-vocab", "qwen2", 260, tokenizer_dir if given == "model_dir" else None)
    size = len(load_tokenizer(tokenizer_dir))
    assert size > 260
    cfg = sft_run(tmp_path, model_dir, None if given == "model_dir" else str(tokenizer_dir))
    field = r"model\.pretrained_path \(its tokenizer\)" if given == "model_dir" else r"data\.tokenizer\.path"
    with pytest.raises(UserError, match=rf"^{field}=\S+ has {size} tokens but model\.pretrained_path=\S+ has "
                                        r"vocab_size 260: .*data\.tokenizer\.path") as err:
        prepare_data(cfg)
    assert "\n" not in str(err.value)


def test_prepare_pretrained_path_without_tokenizer_files_is_refused_and_untouched(tmp_path):
    model_dir = save_model(tmp_path / "bare-mistral", "mistral", 300, None)
    before = sorted(p.name for p in model_dir.iterdir())
    with pytest.raises(UserError, match=r"^model\.pretrained_path=\S+bare-mistral: holds no tokenizer .*"
                                        r"set data\.tokenizer\.path"):
        prepare_data(sft_run(tmp_path, model_dir))
    assert sorted(p.name for p in model_dir.iterdir()) == before


def test_prepare_pretrained_path_missing_is_refused_in_one_line(tmp_path):
    with pytest.raises(UserError, match=r"^model\.pretrained_path=\S+nowhere: no such directory"):
        prepare_data(sft_run(tmp_path, tmp_path / "nowhere"))


def safetensors_dtypes(path: Path) -> set[str]:
    """The dtypes in a safetensors file's header (8-byte little-endian length, then JSON)."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    return {v["dtype"] for k, v in header.items() if k != "__metadata__"}


@pytest.mark.parametrize(("dtype", "stored"), [("bf16", "BF16"), ("fp32", "F32")])
def test_export_dtype_writes_safetensors_in_that_dtype(dtype, stored, tmp_path, tokenizer_dir):
    from d3ray.cli import main

    model_dir = save_model(tmp_path / "gpt2", "gpt2", 300, tokenizer_dir)
    out = tmp_path / f"out-{dtype}"
    assert main(["export", str(model_dir), "--out", str(out), "--dtype", dtype]) == 0
    assert safetensors_dtypes(out / "model.safetensors") == {stored}
    exported = transformers.AutoModelForCausalLM.from_pretrained(str(out))
    original = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir))
    for (name, a), (_, b) in zip(exported.state_dict().items(), original.state_dict().items(), strict=True):
        assert torch.equal(a.float(), b.to(a.dtype).float()), name  # each weight rounded once, nothing else
    assert json.loads((out / "d3ray_export.json").read_text())["dtype"] == dtype
