"""SFT end to end on the skill suite: loss-masked sequences train a tiny GPT-2 to memorise a few
records; ``d3ray eval`` (lm-eval greedy generation + the recomputing checker) agrees with a direct
greedy decode, per skill and difficulty; the same run through a Ray task; bad SFT eval input."""

import json
import math
import re

import numpy as np
import pytest
import torch

from d3ray.cli import main
from d3ray.data.config import TokenizerConfig
from d3ray.data.labels import batch_width, lm_labels
from d3ray.data.ledger import BadRecordLedger
from d3ray.data.sft import SftDataConfig, plain_prompt
from d3ray.data.sft_sequences import iter_sft_sequences, read_sft_records
from d3ray.data.skills import check_answer, generate_suite, write_sft_suite
from d3ray.data.tokenizer import load_tokenizer, save_tokenizer, train_tokenizer_from_texts


@pytest.fixture(scope="module")
def memorised(tmp_path_factory):
    """(HF model dir, eval folder): a tiny GPT-2 trained with response-only loss on 16 suite records."""
    import transformers

    root = tmp_path_factory.mktemp("sft")
    suite = write_sft_suite(root / "suite", seed=0, train_per_skill=0, test_per_skill=8)
    folder = root / "eval"
    folder.mkdir()
    for skill in ("add1", "copy"):
        (folder / f"{skill}.jsonl").write_text((suite / "test" / f"{skill}.jsonl").read_text())
    texts = [plain_prompt((("user", r.prompt),)) + r.response for r in generate_suite(0, 100, 0)["train"]]
    tok = load_tokenizer(train_tokenizer_from_texts(texts, TokenizerConfig(vocab_size=300, split_digits=True),
                                                    root / "tokenizer"))
    seqs = list(iter_sft_sequences(SftDataConfig(paths=[str(folder)], seq_len=48), tok, BadRecordLedger()))
    ids = np.stack([s.tokens for s in seqs])
    n_tokens = np.array([s.n_tokens for s in seqs])
    width = batch_width(n_tokens)  # per-batch dynamic padding
    inputs = torch.as_tensor(ids[:, :width], dtype=torch.long)
    labels = torch.as_tensor(lm_labels(ids, n_tokens, np.stack([s.loss_mask for s in seqs]))[:, :width])
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=64, n_positions=48, vocab_size=len(tok),
                                  bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    for _ in range(150):
        loss = model(input_ids=inputs, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(loss.detach()) < 0.05, f"did not memorise: loss {float(loss.detach())}"
    model.save_pretrained(root / "model")
    save_tokenizer(tok, root / "model")
    return root / "model", folder


def greedy_breakdown(model_dir, folder):
    """Exact match by skill and by (skill, difficulty) from a direct greedy decode, unbatched."""
    import transformers

    tok = load_tokenizer(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True).eval()
    records = read_sft_records([str(folder)])
    longest = max(len(tok(r.response, add_special_tokens=False)["input_ids"]) for r in records)
    groups: dict[str, list[float]] = {}
    for r in records:
        prompt = tok(plain_prompt((("user", r.prompt),)), return_tensors="pt", add_special_tokens=False)
        out = model.generate(**prompt, max_new_tokens=longest + 4, do_sample=False, pad_token_id=tok.eos_token_id)
        text = tok.decode(out[0, prompt["input_ids"].shape[1]:], skip_special_tokens=False)
        text = text.split("<|endoftext|>")[0].split("\n")[0]
        ok = float(check_answer(r.task, r.prompt, text))
        for key in (r.task, f"{r.task}:d{r.difficulty}"):
            groups.setdefault(key, []).append(ok)
    return {k: math.fsum(v) / len(v) for k, v in groups.items()}, len(records)


@pytest.mark.slow
def test_eval_sft_exact_match_matches_direct_greedy_decode(memorised, tmp_path, capsys):
    model_dir, folder = memorised
    out = tmp_path / "results.json"
    assert main(["eval", str(model_dir), "--tasks", f"sft={folder}", "--out", str(out), "--batch-size", "1"]) == 0
    assert "sft:eval:add1" in capsys.readouterr().out  # the printed table
    result = json.loads(out.read_text())
    metrics = result["metrics"]
    expected, n = greedy_breakdown(model_dir, folder)
    assert result["examples"] == {"sft:eval": n}
    for key, value in expected.items():
        assert metrics[f"eval/sft:eval:{key}/exact_match"] == value, key
    assert metrics["eval/sft:eval/exact_match"] >= 0.9  # memorised: the checker sees right answers


@pytest.mark.slow
@pytest.mark.ray
def test_eval_as_ray_task_same_metrics(memorised, ray_cluster, tmp_path):
    model_dir, folder = memorised
    local, remote = tmp_path / "local.json", tmp_path / "ray.json"
    assert main(["eval", str(model_dir), "--tasks", f"sft={folder / 'copy.jsonl'}", "--out", str(local)]) == 0
    assert main(["eval", str(model_dir), "--tasks", f"sft={folder / 'copy.jsonl'}", "--out", str(remote),
                 "--ray", "--cpus", "1"]) == 0
    assert json.loads(remote.read_text())["metrics"] == json.loads(local.read_text())["metrics"]


def test_eval_bad_sft_record_fails_in_the_driver_with_file_and_line(memorised, tmp_path, capsys):
    model_dir, _ = memorised
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "3+5=", "response": "8", "task": "add1"}) + "\n"
                   + json.dumps({"prompt": "3+6=", "task": "add1"}) + "\n")
    # one line on the console (EvalInputError is a UserError), raised before Ray is touched
    assert main(["eval", str(model_dir), "--tasks", f"sft={bad}", "--ray"]) == 2
    err = capsys.readouterr().err
    assert re.search(r"bad\.jsonl line 2: missing_response", err) and "Traceback" not in err
