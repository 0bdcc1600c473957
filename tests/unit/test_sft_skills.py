"""The generated SFT skill suite: disjoint held-out prompts, answers right by recomputation."""

import json
from collections import Counter

import pytest

from d3ray.cli import main
from d3ray.data.skills import (
    DIFFICULTIES,
    PREREQUISITES,
    SKILLS,
    check_answer,
    generate_suite,
    is_test_prompt,
    solve,
    write_sft_suite,
)


def test_solve_worked_examples_exact():
    assert solve("copy", "copy: 40172") == "40172"
    assert solve("add1", "3+5=") == "8"
    assert solve("add", "472+389=") == "861"
    assert solve("mul", "37*8=") == "296"
    assert solve("sort", "sort: 5 2 9 1") == "1 2 5 9"
    assert solve("reverse", "reverse: 5 2 9 1") == "1 9 2 5"
    assert solve("word", "Ann has 12 pens. Ann gets 7 more. How many pens does Ann have?") == "19"
    assert solve("word", "Ben has 30 coins. Ben gives away 4. How many coins are left?") == "26"
    assert solve("word", "Eva has 10 cards, gets 5 more and gives away 12. How many cards are left?") == "3"
    assert solve("word", "Dan buys 3 bags of 12 shells. How many shells is that?") == "36"


def test_check_answer_rejects_wrong_and_accepts_whitespace_variants():
    assert check_answer("add", "472+389=", " 861\n")
    assert not check_answer("add", "472+389=", "851")
    assert check_answer("sort", "sort: 5 2 9 1", "1  2 5 9")
    assert not check_answer("reverse", "reverse: 5 2 9 1", "1 2 5 9")


def test_solve_unparseable_prompt_or_unknown_skill_raises():
    with pytest.raises(ValueError, match="not in the format of skill 'mul'"):
        solve("mul", "37+8=")
    with pytest.raises(ValueError, match="unknown skill 'poetry'"):
        solve("poetry", "write a poem")


def test_suite_test_split_disjoint_from_train_and_every_answer_recomputes():
    suite = generate_suite(seed=3, train_per_skill=300, test_per_skill=60)
    train = {r.prompt for r in suite["train"]}
    test = {r.prompt for r in suite["test"]}
    assert train and test and not train & test
    assert len(test) == len(suite["test"])  # unique within the split
    for split, records in suite.items():
        for r in records:
            assert check_answer(r.task, r.prompt, r.response), (split, r)
            assert is_test_prompt(r.prompt, 0.2) == (split == "test")
            assert r.difficulty in DIFFICULTIES[r.task]
    by_skill = Counter(r.task for r in suite["test"])
    assert set(by_skill) == set(SKILLS)
    assert by_skill["add"] == 60  # a large prompt space fills its quota
    assert by_skill["add1"] < 60  # 100 facts: only the test-hashed ones, counted in the manifest


def test_suite_difficulty_grades_answer_length():
    suite = generate_suite(seed=0, train_per_skill=400, test_per_skill=0)
    mean_len = {}
    for level in DIFFICULTIES["add"]:
        answers = [r.response for r in suite["train"] if r.task == "add" and r.difficulty == level]
        mean_len[level] = sum(map(len, answers)) / len(answers)
    assert mean_len[2] < mean_len[3] < mean_len[4] < mean_len[5]


def test_prerequisites_form_a_dag_over_the_skills():
    order: list[str] = []
    remaining = dict(PREREQUISITES)
    while remaining:
        ready = [s for s, pre in remaining.items() if all(p in order for p in pre)]
        assert ready, f"cycle among {sorted(remaining)}"
        order += sorted(ready)
        for s in ready:
            del remaining[s]
    assert order.index("copy") < order.index("add1") < order.index("add") < order.index("mul") < order.index("word")


def test_write_sft_suite_same_seed_byte_identical_and_cli(tmp_path, capsys):
    a = write_sft_suite(tmp_path / "a", seed=1, train_per_skill=50, test_per_skill=10)
    assert main(["data", "sft-sample", "--out", str(tmp_path / "b"), "--seed", "1",
                 "--train-per-skill", "50", "--test-per-skill", "10"]) == 0
    assert "wrote the SFT skill suite" in capsys.readouterr().out
    for split in ("train", "test"):
        for skill in SKILLS:
            left = (a / split / f"{skill}.jsonl").read_bytes()
            assert left == (tmp_path / "b" / split / f"{skill}.jsonl").read_bytes()
    line = json.loads((a / "train" / "word.jsonl").read_text().splitlines()[0])
    assert set(line) == {"prompt", "response", "task", "difficulty"} and line["task"] == "word"
    manifest = json.loads((a / "manifest.json").read_text())
    assert sum(manifest["counts"]["test"]["add"].values()) == 10


def test_suite_tokenizer_one_token_per_digit_and_exact_round_trip(tmp_path):
    from d3ray.data.config import TokenizerConfig
    from d3ray.data.sft import plain_prompt
    from d3ray.data.tokenizer import load_tokenizer, train_tokenizer_from_texts

    records = generate_suite(seed=0, train_per_skill=100, test_per_skill=20)
    texts = [plain_prompt((("user", r.prompt),)) + r.response for r in records["train"]]
    tok = load_tokenizer(train_tokenizer_from_texts(texts, TokenizerConfig(vocab_size=400, split_digits=True),
                                                    tmp_path / "tok"))
    for r in records["test"]:
        text = plain_prompt((("user", r.prompt),)) + r.response
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == text
        pieces = [tok.decode([i]) for i in ids]
        assert all(not any(ch.isdigit() for ch in p) or p.strip().isdigit() and len(p.strip()) == 1 for p in pieces)
