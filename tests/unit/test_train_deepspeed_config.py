"""``train.deepspeed``: a DeepSpeed JSON fragment merged over the generated config (offload and the
rest), refused in one line where it contradicts a typed field; ``train.activation_checkpointing``
recomputes activations without changing the step's loss or gradients."""

from __future__ import annotations

import pytest
import torch

from d3ray.config import RunConfig
from d3ray.config_loading import ConfigError, load_config
from d3ray.train.config import TrainConfig
from d3ray.train.deepspeed_config import deepspeed_config, merge_deepspeed_overrides

OFFLOAD = {"zero_optimization": {"offload_optimizer": {"device": "cpu", "pin_memory": True},
                                 "offload_param": {"device": "cpu"}, "stage3_max_live_parameters": 10**8}}


def test_deepspeed_config_offload_fragment_is_merged_keeping_the_generated_keys():
    cfg = TrainConfig(zero_stage=3, deepspeed=OFFLOAD)
    merged = deepspeed_config(cfg)
    plain = deepspeed_config(TrainConfig(zero_stage=3))
    assert merged["zero_optimization"] == {**plain["zero_optimization"], **OFFLOAD["zero_optimization"]}
    assert {k: v for k, v in merged.items() if k != "zero_optimization"} == {
        k: v for k, v in plain.items() if k != "zero_optimization"}
    assert "offload_param" not in plain["zero_optimization"]  # the merge copies, never edits the generated dict


def test_deepspeed_config_hf_auto_values_and_equal_values_keep_the_typed_ones():
    """A Hugging Face Trainer DeepSpeed JSON (``auto`` everywhere) passes as it is."""
    hf_json = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
               "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}},
               "bf16": {"enabled": "auto"}, "zero_optimization": {"stage": 2, "overlap_comm": True,
                                                                   "reduce_bucket_size": "auto"}}
    cfg = TrainConfig(zero_stage=2, lr=1e-3, deepspeed=hf_json)
    merged = deepspeed_config(cfg)
    assert merged["optimizer"]["params"]["lr"] == 1e-3
    assert merged["train_micro_batch_size_per_gpu"] == cfg.micro_batch_size
    assert merged["zero_optimization"] == {"stage": 2, "overlap_comm": True}


@pytest.mark.parametrize(("fragment", "message"), [
    ({"zero_optimization": {"stage": 3}}, r"train\.deepspeed\.zero_optimization\.stage=3 conflicts with train\.zero_stage \(= 2\)"),
    ({"train_micro_batch_size_per_gpu": 2}, r"train\.deepspeed\.train_micro_batch_size_per_gpu=2 conflicts with "
                                            r"train\.micro_batch_size \(= 4\)"),
    ({"gradient_accumulation_steps": 4}, r"train\.deepspeed\.gradient_accumulation_steps=4 conflicts with train\.global_batch_size"),
    ({"optimizer": {"params": {"lr": 0.1}}}, r"train\.deepspeed\.optimizer\.params\.lr=0\.1 conflicts with train\.lr \(= 0\.003\)"),
    ({"scheduler": {"type": "WarmupLR"}}, r"train\.deepspeed\.scheduler=\{.*\} conflicts with d3ray's LR schedule"),
    ({"fp16": {"enabled": True}}, r"train\.deepspeed\.fp16\.enabled=True conflicts with train\.precision"),
])
def test_deepspeed_config_key_owned_by_a_typed_field_is_refused_naming_both(fragment, message):
    with pytest.raises(ValueError, match=message) as err:
        TrainConfig(deepspeed=fragment)
    assert "set the typed field instead" in str(err.value) and "\n" not in str(err.value)


def test_deepspeed_config_conflict_from_the_command_line_is_one_user_error_line():
    with pytest.raises(ConfigError, match=r"^train: train\.deepspeed\.zero_optimization\.stage=1 conflicts with "
                                          r"train\.zero_stage \(= 3\)"):
        load_config(RunConfig, None, ["--train.zero_stage=3", "--train.deepspeed={zero_optimization: {stage: 1}}"])


def test_merge_deepspeed_overrides_nested_mapping_replaces_leaves_only():
    merged = merge_deepspeed_overrides({"a": {"b": 1, "c": 2}, "d": 3}, {"a": {"c": 5, "e": {"f": 6}}, "g": [1]})
    assert merged == {"a": {"b": 1, "c": 5, "e": {"f": 6}}, "d": 3, "g": [1]}


def test_activation_checkpointing_same_loss_and_gradients_through_the_loss_path():
    from d3ray.model import ModelConfig, build_model, enable_activation_checkpointing, model_config_dict
    from d3ray.model.lm_loss import sequence_losses, step_loss

    cfg = ModelConfig(preset="llama-tiny")
    ids = torch.randint(0, 300, (2, 16), generator=torch.Generator().manual_seed(0))
    labels = torch.cat([ids[:, 1:], torch.full((2, 1), -100)], dim=1)
    runs = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = build_model(model_config_dict(cfg, 300, 16, 0), cfg)
        if checkpointing:
            enable_activation_checkpointing(model)
        recomputed = getattr(model, "is_activation_checkpointing", None)
        assert (model.is_gradient_checkpointing if recomputed is None else recomputed) == checkpointing
        sums, counts = sequence_losses(model(input_ids=ids).logits, labels)
        loss = step_loss(sums, counts, torch.tensor([1.0, 0.5]))
        loss.backward()
        runs.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    assert torch.equal(runs[0][0], runs[1][0])
    assert all(torch.allclose(runs[0][1][n], runs[1][1][n], rtol=0, atol=1e-7) for n in runs[0][1])


@pytest.mark.parametrize(("zero", "message"), [
    ({"offload_optimiser": {"device": "cpu"}}, r"zero_optimization\.offload_optimiser: Extra inputs are not permitted"),
    ({"offload_param": {"device": "gpu"}}, r"zero_optimization\.offload_param\.device: Input should be 'none', 'cpu' or"),
])
def test_check_deepspeed_fragment_zero_key_deepspeed_rejects_is_one_user_error_line(zero, message):
    from d3ray.errors import UserError
    from d3ray.train.deepspeed_config import check_deepspeed_fragment

    check_deepspeed_fragment(TrainConfig(zero_stage=3, deepspeed=OFFLOAD))  # the valid fragment passes
    with pytest.raises(UserError, match=rf"^train\.deepspeed\.{message}.*fix or drop the key$") as err:
        check_deepspeed_fragment(TrainConfig(zero_stage=3, deepspeed={"zero_optimization": zero}))
    assert "\n" not in str(err.value)
