"""Pack tokenized documents into fixed T-token sequences, one domain per sequence.

Packing concatenates documents with an EOS token after each and cuts the stream every T tokens
(the GPT-2/nanoGPT pre-training format). D3 and the domain-mixing schedulers need a domain per
training sample, so the packer keeps one buffer per domain: a sequence never mixes domains.

Each sequence is named by the position of its first token, ``"<shard>:<line>:<offset>"`` (the
shard's stable name, the 1-based line of the document, and the token offset inside that
document, where ``offset == len(doc)`` is the EOS after it). The id is a pure function of the
corpus and the tokenizer, so a deterministic re-stream gives the same ids: this is what
exactly-once accounting across restarts keys on.

Pure Python + NumPy, no Ray.

    doc a (domain X): a0 a1 a2 a3 a4          T = 4, E = EOS
    doc b (domain X): b0 b1
    doc c (domain Y): c0 c1 c2
      X: [a0 a1 a2 a3] id a:0   [a4 E b0 b1] id a:4   flush: [E E E E] n_tokens 1, id b:2
      Y: [c0 c1 c2 E] id c:0
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PackedSequence:
    """One training sequence.

    ``tokens``: (T,) int32. ``n_tokens`` real tokens come first; a final partial sequence of a
    domain (from :meth:`SequencePacker.flush`) is right-padded with EOS and has ``n_tokens < T``.
    ``loss_mask``: (T,) bool, the tokens that are targets of the loss (SFT: responses and their
    EOS, see ``sft_sequences.py``); None means every real token (pre-training).
    """

    tokens: np.ndarray
    domain: str
    sample_id: str
    n_tokens: int
    loss_mask: np.ndarray | None = None


@dataclass(frozen=True)
class TokenizedDocument:
    """A document's tokens (without EOS) and where it came from. ``token_ids``: (n,) int."""

    token_ids: np.ndarray
    domain: str
    shard: str
    line: int


def make_sample_id(shard: str, line: int, offset: int) -> str:
    """The stable id ``"<shard>:<line>:<offset>"`` of the sequence that starts at that token."""
    return f"{shard}:{line}:{offset}"


def parse_sample_id(sample_id: str) -> tuple[str, int, int]:
    """Inverse of :func:`make_sample_id`; shard names (URIs) may themselves contain ``:``."""
    shard, line, offset = sample_id.rsplit(":", 2)
    return shard, int(line), int(offset)


class _DomainBuffer:
    """Tokens of one domain not yet emitted (fewer than T), and the id of the first of them."""

    __slots__ = ("parts", "n", "head_id")

    def __init__(self) -> None:
        self.parts: list[np.ndarray] = []
        self.n = 0
        self.head_id = ""


class SequencePacker:
    """Packs documents into (T,) sequences per domain, EOS after every document.

    Args:
        seq_len: T, tokens per sequence.
        eos_id: the EOS token id, appended after each document and used as right padding.
    """

    def __init__(self, seq_len: int, eos_id: int) -> None:
        if seq_len < 1:
            raise ValueError(f"seq_len must be >= 1, got {seq_len}")
        self.seq_len = seq_len
        self.eos_id = eos_id
        self._buffers: dict[str, _DomainBuffer] = {}

    def feed(self, doc: TokenizedDocument) -> list[PackedSequence]:
        """Add one document (its tokens then EOS); return the sequences it completes, in order."""
        T = self.seq_len
        tokens = np.empty(len(doc.token_ids) + 1, dtype=np.int32)  # (n + 1,) doc then EOS
        tokens[:-1] = doc.token_ids
        tokens[-1] = self.eos_id
        buf = self._buffers.setdefault(doc.domain, _DomainBuffer())
        out: list[PackedSequence] = []
        pos = 0
        if buf.n:
            need = T - buf.n
            if len(tokens) < need:
                buf.parts.append(tokens)
                buf.n += len(tokens)
                return out
            seq = np.concatenate([*buf.parts, tokens[:need]])
            out.append(PackedSequence(seq, doc.domain, buf.head_id, T))
            buf.parts, buf.n = [], 0
            pos = need
        while len(tokens) - pos >= T:
            seq = tokens[pos : pos + T].copy()  # a copy, so a sequence does not pin the whole document
            out.append(PackedSequence(seq, doc.domain, make_sample_id(doc.shard, doc.line, pos), T))
            pos += T
        if pos < len(tokens):
            buf.parts = [tokens[pos:].copy()]
            buf.n = len(tokens) - pos
            buf.head_id = make_sample_id(doc.shard, doc.line, pos)
        return out

    def flush(self, domain_order: Iterable[str] | None = None) -> list[PackedSequence]:
        """Emit each domain's partial sequence, right-padded with EOS, and empty the buffers.

        Args:
            domain_order: the order of domains in the output (default: sorted); domains not
                listed follow, sorted.
        """
        order = list(domain_order or [])
        order += sorted(set(self._buffers) - set(order))
        out = []
        for domain in order:
            buf = self._buffers.get(domain)
            if buf is None or not buf.n:
                continue
            seq = np.full(self.seq_len, self.eos_id, dtype=np.int32)
            seq[: buf.n] = np.concatenate(buf.parts)
            out.append(PackedSequence(seq, domain, buf.head_id, buf.n))
        self._buffers.clear()
        return out

    def pending_tokens(self) -> dict[str, int]:
        """Tokens waiting in each domain's buffer."""
        return {d: b.n for d, b in self._buffers.items() if b.n}
