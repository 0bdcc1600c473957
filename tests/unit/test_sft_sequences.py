"""SFT records → loss-masked sequences: labels by hand, masking through a real model, bad records."""

import json

import numpy as np
import pytest
import torch

from d3ray.data.chunker import make_batch
from d3ray.data.config import TokenizerConfig
from d3ray.data.labels import IGNORE_INDEX, batch_width, lm_labels
from d3ray.data.ledger import BadRecordFractionError, BadRecordLedger
from d3ray.data.packing import PackedSequence
from d3ray.data.sft import SftDataConfig, parse_sft_line, plain_prompt, render_messages
from d3ray.data.sft_sequences import SftStats, fit_example, iter_sft_sequences, read_sft_records
from d3ray.data.skills import generate_suite
from d3ray.data.tokenizer import load_tokenizer, train_tokenizer_from_texts


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    suite = generate_suite(seed=0, train_per_skill=60, test_per_skill=0)
    texts = [plain_prompt((("user", r.prompt),)) + r.response for r in suite["train"]]
    out = tmp_path_factory.mktemp("tok") / "tokenizer"
    return load_tokenizer(train_tokenizer_from_texts(texts, TokenizerConfig(vocab_size=400, split_digits=True), out))


def write_jsonl(path, lines):
    path.write_text("".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines))
    return path


def test_lm_labels_hand_built_case_exact():
    ids = np.array([[5, 6, 7, 8, 9, 0], [1, 2, 3, 4, 0, 0]])
    mask = np.array([[0, 0, 1, 1, 1, 0], [0, 1, 1, 1, 1, 1]], dtype=bool)
    labels = lm_labels(ids, np.array([5, 4]), mask)
    assert labels.dtype == np.int64
    assert labels.tolist() == [[-100, -100, 7, 8, 9, -100], [-100, 2, 3, 4, -100, -100]]
    assert lm_labels(ids, np.array([6, 2])).tolist() == [[5, 6, 7, 8, 9, 0], [1, 2, -100, -100, -100, -100]]
    assert batch_width(np.array([5, 4])) == 5
    with pytest.raises(ValueError, match="loss_mask has shape"):
        lm_labels(ids, np.array([5, 4]), mask[:, :3])


def test_response_only_loss_equals_hand_computed_nll_on_response_targets():
    # A real tiny GPT-2; the HF loss with lm_labels must be the mean NLL of the response targets
    # only, computed here from the logits; prompt targets must not enter it.
    import transformers

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=8, vocab_size=11)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    ids = np.array([[3, 4, 5, 6, 7, 10, 10, 10], [1, 2, 9, 10, 10, 10, 10, 10]])
    mask = np.zeros_like(ids, dtype=bool)
    mask[0, 3:6] = True  # prompt 3 4 5, response 6 7 + EOS(10)
    mask[1, 2:4] = True  # prompt 1 2, response 9 + EOS
    n_tokens = np.array([6, 4])
    labels = torch.as_tensor(lm_labels(ids, n_tokens, mask))
    with torch.no_grad():
        out = model(input_ids=torch.as_tensor(ids), labels=labels)
        logp = torch.log_softmax(out.logits.double(), dim=-1)
    targets = [(0, 3), (0, 4), (0, 5), (1, 2), (1, 3)]  # (row, position of the target token)
    nll = [-logp[b, t - 1, ids[b, t]] for b, t in targets]
    assert torch.allclose(out.loss.double(), torch.stack(nll).mean(), rtol=1e-6, atol=0)
    # Changing a prompt position's label to anything scored would change the loss; -100 there does not.
    other = labels.clone()
    other[0, 1] = 4
    with torch.no_grad():
        assert not torch.isclose(model(input_ids=torch.as_tensor(ids), labels=other).loss, out.loss)


def test_fit_example_truncates_oldest_prompt_tokens_or_skips():
    tokens, mask, outcome = fit_example([1, 2, 3], [7, 0], seq_len=8, overlong="truncate_prompt")
    assert tokens.tolist() == [1, 2, 3, 7, 0] and mask.tolist() == [0, 0, 0, 1, 1] and outcome == "kept"
    tokens, mask, outcome = fit_example([1, 2, 3, 4, 5], [7, 8, 0], seq_len=6, overlong="truncate_prompt")
    assert tokens.tolist() == [3, 4, 5, 7, 8, 0] and outcome == "truncated_prompt"
    assert fit_example([1, 2, 3, 4, 5], [7, 8, 0], seq_len=6, overlong="skip") is None
    assert fit_example([1], [7, 8, 9, 0], seq_len=4, overlong="truncate_prompt") is None  # response + EOS > T-1


def test_sft_stream_pad_masks_only_response_and_eos(tmp_path, tokenizer):
    f = write_jsonl(tmp_path / "a.jsonl", [{"prompt": "3+5=", "response": "8", "task": "add1"}])
    seqs = list(iter_sft_sequences(SftDataConfig(paths=[str(f)], seq_len=32), tokenizer, BadRecordLedger()))
    (seq,) = seqs
    prompt_ids = tokenizer(plain_prompt((("user", "3+5="),)), add_special_tokens=False)["input_ids"]
    response_ids = tokenizer("8", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    n = len(prompt_ids) + len(response_ids)
    assert seq.tokens[:n].tolist() == prompt_ids + response_ids and seq.n_tokens == n
    assert seq.loss_mask.tolist() == [False] * len(prompt_ids) + [True] * len(response_ids) + [False] * (32 - n)
    assert seq.domain == "add1" and seq.sample_id == f"{tmp_path.name}/a.jsonl:1:0"


def test_sft_stream_pack_keeps_records_whole_and_tasks_apart(tmp_path, tokenizer):
    records = [{"prompt": f"{i}+{i}=", "response": str(2 * i), "task": "add1" if i % 3 else "mul"} for i in range(9)]
    f = write_jsonl(tmp_path / "b.jsonl", records)
    stats = SftStats()
    padded = list(iter_sft_sequences(SftDataConfig(paths=[str(f)], seq_len=48), tokenizer, BadRecordLedger()))
    packed = list(iter_sft_sequences(SftDataConfig(paths=[str(f)], seq_len=48, batching="pack"),
                                     tokenizer, BadRecordLedger(), stats))
    assert len(padded) == 9 and len(packed) < 9 and stats.sequences == len(packed)
    assert sum(int(s.loss_mask.sum()) for s in packed) == sum(int(s.loss_mask.sum()) for s in padded)
    for s in packed:
        text = tokenizer.decode(s.tokens[: s.n_tokens])
        assert text.count("### user:") == text.count("<|endoftext|>")  # whole records only
        tasks = {r["task"] for r in records if f"\n{r['prompt']}\n" in text}
        assert tasks == {s.domain}


def test_sft_stream_overlong_record_counted(tmp_path, tokenizer):
    f = write_jsonl(tmp_path / "c.jsonl", [{"prompt": "copy: " + "1" * 60, "response": "1" * 60},
                                           {"prompt": "copy: " + "2" * 40, "response": "2" * 8}])
    stats = SftStats()
    seqs = list(iter_sft_sequences(SftDataConfig(paths=[str(f)], seq_len=32), tokenizer, BadRecordLedger(), stats))
    assert stats.skipped_overlong == 1 and stats.truncated_prompt == 1 and len(seqs) == 1
    assert seqs[0].n_tokens == 32 and tokenizer.decode(seqs[0].tokens[seqs[0].loss_mask]) == "22222222<|endoftext|>"


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ('{"prompt": "3+5="}', "missing_response"),
        ('{"prompt": "3+5=", "response": 8}', "non_string_response"),
        ('{"prompt": "  ", "response": "8"}', "empty_prompt"),
        ('{"prompt": "3+5=", "response": ""}', "empty_response"),
        ('{"text": "pretraining"}', "missing_prompt"),
        ("not json at all", "malformed_json"),
        ('["a list"]', "malformed_json"),
        ('{"prompt": "a", "response": "b", "task": 3}', "bad_task"),
        ('{"messages": [{"role": "assistant", "content": "hi"}, {"role": "user", "content": "x"}]}', "bad_messages"),
        ('{"messages": [{"role": "user", "content": "x"}]}', "bad_messages"),
    ],
)
def test_parse_sft_line_bad_records_named(line, reason):
    record = parse_sft_line(line.encode(), "f.jsonl", 7)
    assert record.is_bad and record.bad_reason == reason and record.where == "f.jsonl line 7"


def test_messages_record_renders_plain_template_and_validates():
    record = parse_sft_line(json.dumps({"messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2="},
        {"role": "assistant", "content": "4"}]}).encode(), "m.jsonl", 1)
    assert not record.is_bad and record.task == "sft"

    class NoTemplate:
        chat_template = None

    prompt, response = render_messages(record.messages, NoTemplate())
    assert prompt == "### system:\nBe brief.\n### user:\n2+2=\n### assistant:\n" and response == "4"


def test_bad_records_counted_with_line_then_fraction_error_names_file(tmp_path, tokenizer):
    lines = [{"prompt": "1+1=", "response": "2"}, '{"prompt": "1+2="}', "{broken", {"prompt": "2+2=", "response": "4"}]
    f = write_jsonl(tmp_path / "d.jsonl", lines)
    ledger = BadRecordLedger()
    cfg = SftDataConfig(paths=[str(f)], seq_len=32, max_bad_fraction=0.6)
    assert len(list(iter_sft_sequences(cfg, tokenizer, ledger))) == 2
    assert ledger.bad_by_reason() == {"malformed_json": 1, "missing_response": 1}
    assert ledger.first_lines[(f"{tmp_path.name}/d.jsonl", "missing_response")] == [2]
    strict = SftDataConfig(paths=[str(f)], seq_len=32, max_bad_fraction=0.1)
    with pytest.raises(BadRecordFractionError, match=r"d\.jsonl: 2 bad of 4 records"):
        list(iter_sft_sequences(strict, tokenizer, BadRecordLedger()))
    with pytest.raises(ValueError, match=r"d\.jsonl line 2: missing_response"):
        read_sft_records([str(f)])


def test_chunker_batch_carries_loss_mask_to_labels():
    a = PackedSequence(np.array([1, 2, 3, 0], dtype=np.int32), "add", "f:1:0", 4, np.array([0, 0, 1, 1], dtype=bool))
    b = PackedSequence(np.array([4, 5, 0, 0], dtype=np.int32), "text", "g:1:0", 3)
    batch = make_batch([a, b], epoch=0)
    assert batch.loss_mask.tolist() == [[False, False, True, True], [True, True, True, False]]
    assert lm_labels(batch.input_ids, batch.n_tokens, batch.loss_mask).tolist() == [
        [IGNORE_INDEX, IGNORE_INDEX, 3, 0], [4, 5, 0, IGNORE_INDEX]]
    assert make_batch([b, b], epoch=0).loss_mask is None
