"""A generated multi-skill SFT suite with graded difficulty, prerequisites and a recomputing checker.

Why: a training order can only matter where skills build on each other. This suite is small enough
for the tiny model (prompts of 5-30 tokens, answers of 1-12) and has a real prerequisite structure:

    copy ──► add1 ──► add ──► mul ──► word          (word also needs add: +, −, two steps, ×)
      ├────► sort
      └────► reverse

| skill | prompt → response | difficulty |
|---|---|---|
| copy | ``copy: 40172`` → ``40172`` | digits, 1-6 |
| add1 | ``3+5=`` → ``8`` | 1: no carry, 2: carry |
| add | ``472+389=`` → ``861`` | digits per operand, 2-5 |
| mul | ``37*8=`` → ``296`` | 1: 1×1 digits, 2: 2×1, 3: 2×2, 4: 3×2 |
| sort | ``sort: 5 2 9 1`` → ``1 2 5 9`` | list length, 3-7 |
| reverse | ``reverse: 5 2 9 1`` → ``1 9 2 5`` | list length, 3-7 |
| word | ``Ann has 12 pens. She gets 7 more. How many pens does she have?`` → ``19`` | 1: +, 2: −, 3: + then −, 4: × |

Held-out disjointness is by construction: a prompt goes to test iff a hash of the prompt text falls
below ``test_fraction``, so the same prompt can never be in both splits, whatever the seed or sizes.
Every answer is checked by :func:`check_answer`, which parses the prompt and recomputes the answer
(never reading the stored response); the evaluation's exact match uses the same checker.
A (skill, difficulty) whose prompt space is small (add1 has 100 facts) yields fewer records than
asked; ``manifest.json`` gives the counts.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from d3ray.run_files import write_generated_file

PREREQUISITES: dict[str, tuple[str, ...]] = {
    "copy": (),
    "add1": ("copy",),
    "add": ("add1",),
    "mul": ("add",),
    "sort": ("copy",),
    "reverse": ("copy",),
    "word": ("add", "mul"),
}
"""skill -> the skills it builds on (a DAG; curricula may order by it)."""

DIFFICULTIES: dict[str, tuple[int, ...]] = {
    "copy": (1, 2, 3, 4, 5, 6),
    "add1": (1, 2),
    "add": (2, 3, 4, 5),
    "mul": (1, 2, 3, 4),
    "sort": (3, 4, 5, 6, 7),
    "reverse": (3, 4, 5, 6, 7),
    "word": (1, 2, 3, 4),
}
SKILLS = tuple(PREREQUISITES)

_NAMES = ("Ann", "Ben", "Cleo", "Dan", "Eva", "Finn", "Gus", "Hana", "Ivo", "Jade")
_ITEMS = ("pens", "apples", "coins", "books", "cards", "shells", "stamps", "marbles")


@dataclass(frozen=True)
class SkillRecord:
    """One SFT example of the suite (``task`` is the skill, the domain of the SFT stream)."""

    prompt: str
    response: str
    task: str
    difficulty: int

    def to_json(self) -> str:
        return json.dumps(
            {"prompt": self.prompt, "response": self.response, "task": self.task, "difficulty": self.difficulty}
        )


def _number(rng: random.Random, digits: int) -> int:
    return rng.randint(10 ** (digits - 1) if digits > 1 else 0, 10**digits - 1)


def _gen_copy(rng: random.Random, level: int) -> str:
    return "copy: " + "".join(str(rng.randint(0, 9)) for _ in range(level))


def _gen_add1(rng: random.Random, level: int) -> str:
    while True:
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        if (a + b >= 10) == (level == 2):
            return f"{a}+{b}="


def _gen_add(rng: random.Random, level: int) -> str:
    return f"{_number(rng, level)}+{_number(rng, level)}="


def _gen_mul(rng: random.Random, level: int) -> str:
    digits = {1: (1, 1), 2: (2, 1), 3: (2, 2), 4: (3, 2)}[level]
    return f"{_number(rng, digits[0])}*{_number(rng, digits[1])}="


def _gen_list(name: str) -> Callable[[random.Random, int], str]:
    def gen(rng: random.Random, level: int) -> str:
        return f"{name}: " + " ".join(str(rng.randint(0, 9)) for _ in range(level))

    return gen


def _gen_word(rng: random.Random, level: int) -> str:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    if level == 1:
        a, b = rng.randint(2, 60), rng.randint(2, 40)
        return f"{name} has {a} {item}. {name} gets {b} more. How many {item} does {name} have?"
    if level == 2:
        a = rng.randint(5, 90)
        return f"{name} has {a} {item}. {name} gives away {rng.randint(1, a)}. How many {item} are left?"
    if level == 3:
        a, b = rng.randint(2, 60), rng.randint(2, 40)
        c = rng.randint(1, a + b)
        return f"{name} has {a} {item}, gets {b} more and gives away {c}. How many {item} are left?"
    a, b = rng.randint(2, 9), rng.randint(2, 12)
    return f"{name} buys {a} bags of {b} {item}. How many {item} is that?"


_GENERATORS: dict[str, Callable[[random.Random, int], str]] = {
    "copy": _gen_copy,
    "add1": _gen_add1,
    "add": _gen_add,
    "mul": _gen_mul,
    "sort": _gen_list("sort"),
    "reverse": _gen_list("reverse"),
    "word": _gen_word,
}

_SUM = re.compile(r"^(\d+)\+(\d+)=$")
_PRODUCT = re.compile(r"^(\d+)\*(\d+)=$")
_WORD = (
    (re.compile(r"^\w+ has (\d+) \w+\. \w+ gets (\d+) more\. How many \w+ does \w+ have\?$"), lambda a, b: a + b),
    (re.compile(r"^\w+ has (\d+) \w+\. \w+ gives away (\d+)\. How many \w+ are left\?$"), lambda a, b: a - b),
    (
        re.compile(r"^\w+ has (\d+) \w+, gets (\d+) more and gives away (\d+)\. How many \w+ are left\?$"),
        lambda a, b, c: a + b - c,
    ),
    (re.compile(r"^\w+ buys (\d+) bags of (\d+) \w+\. How many \w+ is that\?$"), lambda a, b: a * b),
)


def solve(task: str, prompt: str) -> str:
    """The correct response to a suite prompt, recomputed from the prompt text alone.

    Raises:
        ValueError: ``task`` is not a suite skill, or ``prompt`` is not in that skill's format.
    """
    if task == "copy" and re.fullmatch(r"copy: \d+", prompt):
        return prompt[len("copy: ") :]
    if task in ("add1", "add") and (m := _SUM.match(prompt)):
        return str(int(m[1]) + int(m[2]))
    if task == "mul" and (m := _PRODUCT.match(prompt)):
        return str(int(m[1]) * int(m[2]))
    if task in ("sort", "reverse") and re.fullmatch(rf"{task}: \d+( \d+)*", prompt):
        items = prompt[len(task) + 2 :].split(" ")
        return " ".join(sorted(items, key=int) if task == "sort" else items[::-1])
    if task == "word":
        for pattern, fn in _WORD:
            if m := pattern.match(prompt):
                return str(fn(*(int(g) for g in m.groups())))
    if task not in PREREQUISITES:
        raise ValueError(f"unknown skill {task!r}; the suite's skills are {list(SKILLS)}")
    raise ValueError(f"prompt {prompt!r} is not in the format of skill {task!r}")


def normalize_response(text: str) -> str:
    """Whitespace-insensitive form of a response: stripped, inner runs of whitespace as one space."""
    return " ".join(text.split())


def check_answer(task: str, prompt: str, response: str) -> bool:
    """Is ``response`` the right answer to ``prompt``? Recomputed from the prompt (see :func:`solve`),
    compared after :func:`normalize_response`. Raises ``ValueError`` for a prompt it cannot parse."""
    return normalize_response(response) == solve(task, prompt)


def exact_match(task: str, prompt: str, response: str, reference: str) -> bool:
    """The SFT exact match of the evaluation and of the NICE selector's reward: a suite skill's answer
    is recomputed from the prompt (:func:`check_answer`); any other task's response is compared with the
    reference after :func:`normalize_response`."""
    if task in PREREQUISITES:
        return check_answer(task, prompt, response)
    return normalize_response(response) == normalize_response(reference)


def is_test_prompt(prompt: str, test_fraction: float) -> bool:
    """The split of a prompt: a pure function of its text (SHA-256), so train and test are disjoint."""
    bucket = int.from_bytes(hashlib.sha256(prompt.encode("utf-8")).digest()[:8], "big") / 2**64
    return bucket < test_fraction


def generate_suite(
    seed: int = 0, train_per_skill: int = 1200, test_per_skill: int = 200, test_fraction: float = 0.2,
    max_attempts_factor: int = 40,
) -> dict[str, list[SkillRecord]]:
    """Generate ``{"train": [...], "test": [...]}``, records of every skill, difficulties in equal shares.

    Prompts are unique within a split and never shared between splits (:func:`is_test_prompt`).
    Each (skill, difficulty) draws at most ``max_attempts_factor`` × its quota candidates, so small
    prompt spaces end early with fewer records instead of looping.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    if train_per_skill < 0 or test_per_skill < 0:
        raise ValueError(f"per-skill counts must be >= 0, got {train_per_skill}, {test_per_skill}")
    out: dict[str, list[SkillRecord]] = {"train": [], "test": []}
    for skill in SKILLS:
        levels = DIFFICULTIES[skill]
        for i, level in enumerate(levels):
            quota = {
                "train": train_per_skill // len(levels) + (i < train_per_skill % len(levels)),
                "test": test_per_skill // len(levels) + (i < test_per_skill % len(levels)),
            }
            rng = random.Random(f"{seed}:{skill}:{level}")
            seen: dict[str, set[str]] = {"train": set(), "test": set()}
            for _ in range(max_attempts_factor * max(1, quota["train"] + quota["test"])):
                if all(len(seen[s]) >= quota[s] for s in seen):
                    break
                prompt = _GENERATORS[skill](rng, level)
                split = "test" if is_test_prompt(prompt, test_fraction) else "train"
                if len(seen[split]) < quota[split] and prompt not in seen[split]:
                    seen[split].add(prompt)
                    out[split].append(SkillRecord(prompt, solve(skill, prompt), skill, level))
    for split, records in out.items():
        random.Random(f"{seed}:shuffle:{split}").shuffle(records)
    return out


def write_sft_suite(
    out_dir: str | Path, seed: int = 0, train_per_skill: int = 1200, test_per_skill: int = 200
) -> Path:
    """Write ``train/<skill>.jsonl``, ``test/<skill>.jsonl`` and ``manifest.json`` under ``out_dir``.

    Each line is ``{"prompt", "response", "task", "difficulty"}``; the same arguments give
    byte-identical files; an existing file of the same name with other content is refused
    (``UserError``), never overwritten. Returns ``out_dir``.
    """
    out = Path(out_dir)
    suite = generate_suite(seed, train_per_skill, test_per_skill)
    counts: dict[str, dict[str, dict[str, int]]] = {}
    for split, records in suite.items():
        (out / split).mkdir(parents=True, exist_ok=True)
        for skill in SKILLS:
            mine = [r for r in records if r.task == skill]
            write_generated_file(out / split / f"{skill}.jsonl", "".join(r.to_json() + "\n" for r in mine).encode())
            per_level = {str(d): sum(r.difficulty == d for r in mine) for d in DIFFICULTIES[skill]}
            counts.setdefault(split, {})[skill] = per_level
    manifest = {
        "seed": seed,
        "train_per_skill": train_per_skill,
        "test_per_skill": test_per_skill,
        "prerequisites": {k: list(v) for k, v in PREREQUISITES.items()},
        "difficulties": {k: list(v) for k, v in DIFFICULTIES.items()},
        "counts": counts,
    }
    write_generated_file(out / "manifest.json", (json.dumps(manifest, indent=2) + "\n").encode())
    return out
