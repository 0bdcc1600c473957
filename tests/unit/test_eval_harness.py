"""lm-eval tasks over local files: answers known from the model's logits, and direct log-prob references."""

import json
import math

import pytest
import torch

from d3ray.data.config import TokenizerConfig
from d3ray.data.tokenizer import load_tokenizer, train_tokenizer_from_texts
from d3ray.eval.harness import prepare_tasks, run_eval_tasks
from d3ray.eval.inputs import EvalTask

WORDS = "Ann has pens apples coins books cards How many does she have left gets more the a of".split()


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    texts = [" ".join(WORDS[i:] + WORDS[:i]) + f" {i}+{i}={2 * i}" for i in range(len(WORDS))] * 20
    out = tmp_path_factory.mktemp("tok") / "tokenizer"
    return load_tokenizer(train_tokenizer_from_texts(texts, TokenizerConfig(vocab_size=320, split_digits=True), out))


def tiny_model(tokenizer, seed=0):
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=64, vocab_size=len(tokenizer),
                                  bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id)
    return transformers.GPT2LMHeadModel(cfg).eval()


def certain_model(tokenizer, token_id: int):
    """A GPT-2 that predicts ``token_id`` at every position whatever the input: the final layer norm
    outputs the constant 50·e_0 and only that token's (tied) embedding has a 1 in dimension 0, so its
    logit is 50 and every other logit 0: log P = 0 for it and exactly -50 for any other token (fp32)."""
    model = tiny_model(tokenizer)
    with torch.no_grad():
        model.transformer.ln_f.weight.zero_()
        model.transformer.ln_f.bias.zero_()
        model.transformer.ln_f.bias[0] = 50.0
        model.transformer.wte.weight[:, 0] = 0.0
        model.transformer.wte.weight[token_id, 0] = 1.0
    return model


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def single_token(tokenizer, text):
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == 1, (text, ids)
    return ids[0]


def test_cloze_and_choice_on_a_model_certain_of_one_word(tokenizer, tmp_path):
    pens = single_token(tokenizer, " pens")
    single_token(tokenizer, " apples")
    model = certain_model(tokenizer, pens)
    cloze = write_jsonl(tmp_path / "cloze.jsonl", [{"context": "Ann has", "continuation": "pens"},
                                                   {"context": "Ann has", "continuation": "apples"}])
    choice = write_jsonl(tmp_path / "choice.jsonl", [{"context": "Ann has", "choices": ["apples", "pens"], "label": 1},
                                                     {"context": "Ann has", "choices": ["apples", "pens"], "label": 0}])
    model.train()
    metrics = run_eval_tasks(model, tokenizer, f"cloze={cloze},choice={choice}", batch_size=4)
    assert model.training  # the caller's mode is restored
    assert metrics["eval/cloze:cloze/acc"] == 0.5  # greedy "pens" is right once
    # log-likelihoods 0 and -50: perplexity exp(-(0 - 50) / 2)
    assert metrics["eval/cloze:cloze/perplexity"] == pytest.approx(math.exp(25.0), rel=1e-12)
    assert metrics["eval/choice:choice/acc"] == 0.5 and metrics["eval/choice:choice/acc_norm"] == 0.5


def continuation_logprob(model, tokenizer, context: str, continuation: str) -> float:
    """log P(continuation | context), the continuation's tokens being those of the joined text after
    the context's tokens (how lm-eval splits them), computed directly in float32."""
    ctx = tokenizer(context, add_special_tokens=False)["input_ids"]
    whole = tokenizer(context + continuation, add_special_tokens=False)["input_ids"]
    with torch.no_grad():  # the last token is only a target, never an input
        logp = torch.log_softmax(model(input_ids=torch.tensor([whole[:-1]])).logits[0], dim=-1)
    targets = torch.tensor(whole[len(ctx):])
    return float(logp[len(ctx) - 1:].gather(1, targets[:, None]).sum())


def test_choice_accuracy_matches_direct_log_probabilities(tokenizer, tmp_path):
    model = tiny_model(tokenizer, seed=3)
    rows = []
    for i in range(12):
        choices = [WORDS[(i + k) % len(WORDS)] + (" more" if k == 1 else "") for k in range(3)]
        rows.append({"context": f"{WORDS[i]} has {i}", "choices": choices, "label": i % 3})
    path = write_jsonl(tmp_path / "mc.jsonl", rows)
    metrics = run_eval_tasks(model, tokenizer, [EvalTask("choice", path, "mc")], batch_size=5)
    acc = acc_norm = 0
    for row in rows:
        lls = [continuation_logprob(model, tokenizer, row["context"], " " + c) for c in row["choices"]]
        acc += max(range(3), key=lambda k: lls[k]) == row["label"]
        acc_norm += max(range(3), key=lambda k: lls[k] / len(row["choices"][k])) == row["label"]
    assert metrics["eval/mc/acc"] == acc / len(rows)
    assert metrics["eval/mc/acc_norm"] == acc_norm / len(rows)


def test_ppl_of_a_text_file_matches_direct_rolling_log_likelihood(tokenizer, tmp_path):
    model = tiny_model(tokenizer, seed=5)
    text = "Ann has 12 pens. She gets 7 more. How many pens does she have?"
    (tmp_path / "short.txt").write_text(text)
    metrics = run_eval_tasks(model, tokenizer, f"ppl={tmp_path / 'short.txt'}")
    # Every token is scored, the first one given only EOS (lm-eval's prefix token).
    ll = continuation_logprob(model, tokenizer, tokenizer.eos_token, text)
    n_words, n_bytes = len(text.split()), len(text.encode())
    assert metrics["eval/ppl:short/word_perplexity"] == pytest.approx(math.exp(-ll / n_words), rel=1e-6)
    assert metrics["eval/ppl:short/bits_per_byte"] == pytest.approx(-ll / n_bytes / math.log(2), rel=1e-6)


def test_domains_task_per_domain_metrics_and_bad_lines_counted(tokenizer, tmp_path):
    folder = tmp_path / "val"
    folder.mkdir()
    lines = [json.dumps({"text": "Ann has pens.", "meta": {"redpajama_set_name": "RedPajamaC4"}}),
             json.dumps({"text": "How many books?", "meta": {"redpajama_set_name": "RedPajamaBook"}}),
             "{not json"]
    (folder / "shard.jsonl").write_text("\n".join(lines) + "\n")
    (prepared,) = prepare_tasks(f"domains={folder}", tokenizer)
    assert prepared.data_quality["bad"] == {"val/shard.jsonl": {"malformed_json": 1}}
    metrics = run_eval_tasks(tiny_model(tokenizer), tokenizer, [prepared])
    assert {k.rsplit("/", 1)[0] for k in metrics} == {"eval/domains:val:RedPajamaBook", "eval/domains:val:RedPajamaC4"}
    assert all(v > 0 for v in metrics.values())
