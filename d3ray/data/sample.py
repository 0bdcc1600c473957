"""A deterministic, generated SlimPajama-format corpus for the default job, demos and tests.

``write_sample_corpus(out_dir)`` writes the SlimPajama layout (``train/chunk1/*.jsonl.zst``,
``validation/chunk1/*.jsonl.zst``, each line ``{"text", "meta": {"redpajama_set_name"}}``) with all
seven SlimPajama domains. Each domain has its own text style and word list (LaTeX for ArXiv, code
for GitHub, Q&A for StackExchange, ...) so a model's per-domain losses differ, as on real data.
The same seed gives byte-identical files. The default size (about 0.4 M BPE tokens of training
text) is enough for a few hundred steps of T=128, B=8.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable
from pathlib import Path

import zstandard

from d3ray.data.config import DEFAULT_DOMAINS
from d3ray.run_files import write_generated_file

logger = logging.getLogger(__name__)

# Share of documents per domain (C4 and CommonCrawl dominate SlimPajama, books are rare but long).
DOMAIN_WEIGHTS = {
    "RedPajamaArXiv": 0.08,
    "RedPajamaBook": 0.04,
    "RedPajamaC4": 0.26,
    "RedPajamaCommonCrawl": 0.26,
    "RedPajamaGithub": 0.12,
    "RedPajamaStackExchange": 0.14,
    "RedPajamaWikipedia": 0.10,
}

_COMMON = "the of and to in a is that for it as with was on be by this are from at or an".split()
_NAMES = "Alder Brook Castell Dunmore Elling Farrow Garnet Hollis Irwin Juniper Kestrel Larkin Marlow".split()
_PLACES = "Northmere Vale Ostby Port Aster Redfern Silverton Tamsin Ulverby Westhollow Yarrow Zennor".split()
_WIKI = "river village council century parish railway district population founded census station".split()
_WEB = "best quality service customers offer price online shop free today team order delivery".split()
_CC = "posted admin comments reply share login menu home privacy cookies archive updated".split()
_CODE = "value index result items config path buffer count name data node parent child".split()
_QA = "error function version install command file works problem answer question example".split()
_MATH = "theorem lemma proof let space operator bounded function measure converges holds".split()
_BOOK = "she he said looked door night hand eyes heart voice room morning letter window".split()


def _words(rng: random.Random, pool: list[str], n: int) -> str:
    return " ".join(rng.choice(pool) if rng.random() < 0.6 else rng.choice(_COMMON) for _ in range(n))


def _wikipedia(rng: random.Random) -> str:
    name, place = rng.choice(_NAMES), rng.choice(_PLACES)
    parts = [f"{name} is a {rng.choice(_WIKI)} in {place}. It was founded in {rng.randint(1100, 1990)}."]
    for heading in rng.sample(["History", "Geography", "Demographics", "Transport", "Economy"], 3):
        parts.append(f"\n== {heading} ==\n")
        for _ in range(rng.randint(3, 6)):
            parts.append(f"In {rng.randint(1200, 2020)} the {_words(rng, _WIKI, rng.randint(8, 16))}.")
    return " ".join(parts)


def _c4(rng: random.Random) -> str:
    parts = [f"Looking for the {rng.choice(_WEB)} {rng.choice(_WEB)} in {rng.choice(_PLACES)}?"]
    for _ in range(rng.randint(5, 12)):
        parts.append(f"Our {_words(rng, _WEB, rng.randint(6, 14))}!")
    parts.append(f"Call us today on 0{rng.randint(100, 999)} {rng.randint(100000, 999999)}.")
    return " ".join(parts)


def _common_crawl(rng: random.Random) -> str:
    lines = [
        "Home | About | Blog | Contact",
        f"Posted by admin on {rng.randint(1, 28)}/{rng.randint(1, 12)}/20{rng.randint(10, 23)}",
    ]
    for _ in range(rng.randint(4, 10)):
        lines.append(_words(rng, _CC, rng.randint(5, 18)).capitalize() + ".")
    lines.append(f"{rng.randint(0, 99)} comments | Share | Reply")
    return "\n".join(lines)


def _github(rng: random.Random) -> str:
    lines = [f"import {rng.choice(['os', 'json', 'math', 're'])}", ""]
    for _ in range(rng.randint(2, 4)):
        fn, a, b = rng.choice(_CODE), rng.choice(_CODE), rng.choice(_CODE)
        lines += [f"def get_{fn}_{a}({a}, {b}={rng.randint(0, 9)}):", f"    {fn} = []"]
        lines += [f"    for {b}_i in range(len({a})):", f"        if {a}[{b}_i] > {rng.randint(0, 99)}:"]
        lines += [f"            {fn}.append({a}[{b}_i] * {b})", f"    return {fn}", ""]
    return "\n".join(lines)


def _stackexchange(rng: random.Random) -> str:
    q = f"Q: How do I fix this {rng.choice(_QA)} {rng.choice(_QA)} in version {rng.randint(1, 9)}.{rng.randint(0, 20)}?"
    body = " ".join(_words(rng, _QA, rng.randint(6, 14)) + "." for _ in range(rng.randint(2, 5)))
    answer = " ".join(_words(rng, _QA, rng.randint(6, 14)) + "." for _ in range(rng.randint(2, 6)))
    return f"{q} {body}\n\nA: You can {answer}"


def _arxiv(rng: random.Random) -> str:
    parts = [f"\\section{{{rng.choice(['Introduction', 'Preliminaries', 'Main results'])}}}"]
    for _ in range(rng.randint(3, 6)):
        i, n = rng.choice("ijkmn"), rng.randint(2, 9)
        parts.append(f"Let $x_{i} \\in \\mathbb{{R}}^{n}$. The {_words(rng, _MATH, rng.randint(6, 14))}.")
        parts.append(
            f"\\begin{{equation}} \\| T x_{i} \\| \\leq {n} \\sum_{{{i}=1}}^{{{n}}} |x_{i}|^2 \\end{{equation}}"
        )
    return "\n".join(parts)


def _book(rng: random.Random) -> str:
    parts = [f"CHAPTER {rng.randint(1, 30)}\n"]
    for _ in range(rng.randint(20, 40)):
        who = rng.choice(_NAMES)
        if rng.random() < 0.4:
            parts.append(f'"{_words(rng, _BOOK, rng.randint(4, 10)).capitalize()}," said {who}.')
        else:
            parts.append(f"{who} {_words(rng, _BOOK, rng.randint(8, 20))}.")
    return " ".join(parts)


STYLES: dict[str, Callable[[random.Random], str]] = {
    "RedPajamaArXiv": _arxiv,
    "RedPajamaBook": _book,
    "RedPajamaC4": _c4,
    "RedPajamaCommonCrawl": _common_crawl,
    "RedPajamaGithub": _github,
    "RedPajamaStackExchange": _stackexchange,
    "RedPajamaWikipedia": _wikipedia,
}
assert set(STYLES) == set(DEFAULT_DOMAINS) == set(DOMAIN_WEIGHTS)


def _records(rng: random.Random, n_docs: int) -> list[dict]:
    """``n_docs`` records, every domain at least once, shuffled."""
    domains = list(DEFAULT_DOMAINS)
    picks = domains + rng.choices(domains, weights=[DOMAIN_WEIGHTS[d] for d in domains], k=max(0, n_docs - 7))
    rng.shuffle(picks)
    return [{"text": STYLES[d](rng), "meta": {"redpajama_set_name": d}} for d in picks[:n_docs]]


def _write_shard(path: Path, records: list[dict]) -> None:
    data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8")
    write_generated_file(path, zstandard.ZstdCompressor(level=3).compress(data))  # never over a user's file


def write_sample_corpus(
    out_dir: str | Path,
    seed: int = 0,
    train_docs: int = 2000,
    validation_docs: int = 280,
    train_shards: int = 4,
    validation_shards: int = 1,
) -> Path:
    """Write the generated corpus under ``out_dir`` and return ``out_dir``.

    Layout: ``train/chunk1/example_train_{i}.jsonl.zst`` (``train_shards`` files) and
    ``validation/chunk1/example_holdout_{i}.jsonl.zst``; documents are dealt to shards round-robin.
    The same arguments give byte-identical files; an existing file of the same name is left
    as it is when it holds those bytes, and otherwise refused (``UserError``), never overwritten.
    """
    if train_docs < 7 or validation_docs < 7:
        raise ValueError(
            f"need at least 7 documents per split (one per domain), got {train_docs}, {validation_docs}"
        )
    if train_shards < 1 or validation_shards < 1:
        raise ValueError(f"need at least one shard per split, got {train_shards}, {validation_shards}")
    out = Path(out_dir)
    rng = random.Random(seed)
    for split, stem, n_docs, n_shards in (
        ("train", "example_train", train_docs, train_shards),
        ("validation", "example_holdout", validation_docs, validation_shards),
    ):
        records = _records(rng, n_docs)
        folder = out / split / "chunk1"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(n_shards):
            _write_shard(folder / f"{stem}_{i}.jsonl.zst", records[i::n_shards])
    logger.info(
        "wrote the sample corpus (seed %d, %d train + %d validation docs) to %s",
        seed,
        train_docs,
        validation_docs,
        out,
    )
    return out
