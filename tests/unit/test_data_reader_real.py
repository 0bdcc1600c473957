"""The reader on the real RedPajama sample (../shared/data), in both layouts.

Expected counts come from ../shared/data/redpajama_sample/README.md (4,262 raw records; 2,131
train + 2,131 validation in SlimPajama format) and its BUILD_NOTE.md: train = every
``sample_*1.jsonl`` + the first record of ``book/sample_book2.jsonl``, validation = every
``sample_*2.jsonl`` except that record. One real arXiv record (``sample_arxiv2.jsonl`` line 3,
in validation) has the text "\\n": it is counted as a record and reported as ``empty_text``.
"""

import hashlib
from collections import Counter
from pathlib import Path

import pytest

from d3ray.data import DEFAULT_DOMAINS, iter_documents, list_shards

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "redpajama_sample"
pytestmark = pytest.mark.skipif(not DATA.is_dir(), reason=f"real sample data not found at {DATA}")

MAX_BYTES = 64 * 1024 * 1024
SPLIT_COUNTS = {
    "RedPajamaArXiv": 10,
    "RedPajamaBook": 1,
    "RedPajamaC4": 1000,
    "RedPajamaCommonCrawl": 10,
    "RedPajamaGithub": 100,
    "RedPajamaStackExchange": 1000,
    "RedPajamaWikipedia": 10,
}
RAW_COUNTS = {  # README: C4 2000, StackExchange 2000, GitHub 200, ArXiv 20, Wikipedia 20, CommonCrawl 20, Book 2
    "RedPajamaArXiv": 20,
    "RedPajamaBook": 2,
    "RedPajamaC4": 2000,
    "RedPajamaCommonCrawl": 20,
    "RedPajamaGithub": 200,
    "RedPajamaStackExchange": 2000,
    "RedPajamaWikipedia": 20,
}


def read(path, layout):
    return [d for s in list_shards(str(path)) for d in iter_documents(s, layout, DEFAULT_DOMAINS, MAX_BYTES)]


@pytest.mark.parametrize("layout", ["slimpajama", "auto"])
def test_reader_slimpajama_split_counts_match_readme(layout):
    train = read(DATA / "slimpajama_format" / "train", layout)
    validation = read(DATA / "slimpajama_format" / "validation", layout)
    assert len(train) == 2131 and len(validation) == 2131
    assert Counter(d.domain for d in train) == SPLIT_COUNTS
    assert Counter(d.domain for d in validation) == SPLIT_COUNTS
    assert [d for d in train if d.is_bad] == []
    bad = [(d.domain, d.bad_reason, d.line) for d in validation if d.is_bad]
    assert len(bad) == 1 and bad[0][:2] == ("RedPajamaArXiv", "empty_text")


@pytest.mark.parametrize("layout", ["redpajama_1t", "auto"])
def test_reader_redpajama_1t_counts_match_readme(layout):
    docs = read(DATA / "redpajama_1t", layout)
    assert len(docs) == 4262
    assert Counter(d.domain for d in docs) == RAW_COUNTS
    assert [(d.shard, d.line, d.bad_reason) for d in docs if d.is_bad] == [
        ("redpajama_1t/arxiv/sample_arxiv2.jsonl", 3, "empty_text")
    ]


def test_reader_both_layouts_same_train_texts_per_domain():
    """BUILD_NOTE: the SlimPajama train shard holds exactly the *1 files + the first book record."""

    def digests(docs):
        return Counter((d.domain, hashlib.sha1(d.text.encode()).hexdigest()) for d in docs if not d.is_bad)

    raw = read(DATA / "redpajama_1t" / "*" / "sample_*1.jsonl", "redpajama_1t")
    raw += read(DATA / "redpajama_1t" / "book" / "sample_book2.jsonl", "redpajama_1t")[:1]
    assert digests(read(DATA / "slimpajama_format" / "train", "slimpajama")) == digests(raw)
