"""Pack tokenized documents into fixed T-token sequences, one domain per sequence.

Packing concatenates documents with an EOS token after each and cuts the stream every T tokens
(the GPT-2/nanoGPT pre-training format). D3 and the domain-mixing schedulers need a domain per
training sample, so the packer keeps one buffer per domain: a sequence never mixes domains.

Each sequence is named by the position of its first token, ``"<shard>:<line>:<offset>"`` (the
shard's stable name, the 1-based line of the document, and the token offset inside that
document, where ``offset == len(doc)`` is the EOS after it). The id is a pure function of the
corpus and the tokenizer, so a deterministic re-stream gives the same ids: this is what
exactly-once accounting across restarts keys on.

The packer works on whole blocks of documents with NumPy (:meth:`SequencePacker.feed_block`: one
gather and one reshape per domain and block, no Python loop over documents or tokens) and emits
sequences in the order a one-document-at-a-time packer would: by the document that completes
them. That order depends only on the documents, not on how they were cut into blocks, which is
what lets a resumed stream skip the sequences of a block it already emitted. Its state (at most
T - 1 carried tokens per domain) is a small JSON-safe dict, so a stream cursor can hold it.

Pure Python + NumPy, no Ray.

    doc a (domain X): a0 a1 a2 a3 a4          T = 4, E = EOS
    doc b (domain X): b0 b1
    doc c (domain Y): c0 c1 c2
      X: [a0 a1 a2 a3] id a:0   [a4 E b0 b1] id a:4   flush: [E E E E] n_tokens 1, id b:2
      Y: [c0 c1 c2 E] id c:0
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

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


@dataclass(frozen=True)
class TokenBlock:
    """Good documents of one stream block, columnar: document i's tokens (without EOS) are
    ``values[offsets[i]:offsets[i + 1]]``. ``values``: (N,) int32; ``offsets``: (n + 1,) int64."""

    values: np.ndarray
    offsets: np.ndarray
    domains: Sequence[str]
    shards: Sequence[str]
    lines: Sequence[int]
    positions: np.ndarray | None = None
    """(n, 4) int64 ShardPosition of each document (line, offset, frame_offset, frame_start), if known."""

    @classmethod
    def of(cls, docs: Sequence[TokenizedDocument]) -> TokenBlock:
        lengths = np.fromiter((len(d.token_ids) for d in docs), dtype=np.int64, count=len(docs))
        offsets = np.zeros(len(docs) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        values = (np.concatenate([np.asarray(d.token_ids, dtype=np.int32) for d in docs])
                  if docs else np.zeros(0, dtype=np.int32))
        return cls(values, offsets, [d.domain for d in docs], [d.shard for d in docs], [d.line for d in docs])


def encode_tokens(tokens: np.ndarray) -> str:
    """Token ids as base64 of little-endian int32 (compact and JSON-safe)."""
    return base64.b64encode(np.asarray(tokens, dtype="<i4").tobytes()).decode("ascii")


def decode_tokens(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype="<i4").astype(np.int32)


def make_sample_id(shard: str, line: int, offset: int) -> str:
    """The stable id ``"<shard>:<line>:<offset>"`` of the sequence that starts at that token."""
    return f"{shard}:{line}:{offset}"


def parse_sample_id(sample_id: str) -> tuple[str, int, int]:
    """Inverse of :func:`make_sample_id`; shard names (URIs) may themselves contain ``:``."""
    shard, line, offset = sample_id.rsplit(":", 2)
    return shard, int(line), int(offset)


@dataclass
class _BlockTrace:
    """What :meth:`SequencePacker.restart_point` needs of the last block: per domain its rows,
    token buffer (carry + documents with EOS) and document starts in it, and the completing row
    of every sequence the block made, in output order (ascending)."""

    block: TokenBlock
    domains: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, str]]
    done_by: np.ndarray

    def sample_id(self, domain: str, p: int, head_id: str) -> str:
        rows, _, doc_at, _ = self.domains[domain]
        if p < doc_at[0]:
            return head_id
        j = int(np.searchsorted(doc_at, p, side="right")) - 1
        r = int(rows[j])
        return make_sample_id(self.block.shards[r], int(self.block.lines[r]), p - int(doc_at[j]))


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
        # domain -> (carried tokens (n < T,), sample id of the first of them). Arrays are replaced,
        # never changed in place, so a shallow copy of this dict is a snapshot.
        self._carry: dict[str, tuple[np.ndarray, str]] = {}
        self._trace: _BlockTrace | None = None  # the last block fed, for :meth:`restart_point`

    def feed(self, doc: TokenizedDocument) -> list[PackedSequence]:
        """Add one document (its tokens then EOS); return the sequences it completes, in order."""
        return self.feed_block(TokenBlock.of([doc]))

    def feed_block(self, block: TokenBlock) -> list[PackedSequence]:
        """Add a block of documents; return the sequences they complete, ordered by the document
        that completes each (as :meth:`feed` one document at a time would)."""
        n = len(block.domains)
        self._trace = None
        if n == 0:
            return []
        T = self.seq_len
        base = block.offsets - block.offsets[0]
        lengths = np.diff(base) + 1  # (n,) tokens per document with its EOS
        eos_at = base[1:] + np.arange(n)  # (n,) index of each EOS in the EOS-interleaved stream
        stream = np.empty(int(base[-1]) + n, dtype=np.int32)  # all documents, EOS after each
        keep = np.ones(len(stream), dtype=bool)
        keep[eos_at] = False
        stream[keep] = block.values[block.offsets[0] : block.offsets[-1]]
        stream[eos_at] = self.eos_id
        starts = eos_at - lengths + 1  # (n,) where each document starts in ``stream``
        rows_of: dict[str, list[int]] = {}
        for i, domain in enumerate(block.domains):
            rows_of.setdefault(domain, []).append(i)
        done_by: list[np.ndarray] = []  # per domain: the completing row of each new sequence
        made: list[tuple[str, np.ndarray, list[str]]] = []
        trace = _BlockTrace(block, {}, np.zeros(0, dtype=np.int64))
        for domain, row_list in rows_of.items():
            rows = np.asarray(row_list, dtype=np.int64)
            seg = lengths[rows]
            if len(rows) == n:
                tokens = stream
            else:  # gather this domain's documents: index = segment start + position in segment
                first = np.cumsum(seg) - seg
                tokens = stream[np.repeat(starts[rows] - first, seg) + np.arange(int(seg.sum()))]
            carried, head_id = self._carry.get(domain, (np.zeros(0, dtype=np.int32), ""))
            buf = np.concatenate([carried, tokens]) if len(carried) else tokens
            doc_at = len(carried) + np.cumsum(seg) - seg  # (m,) document starts in ``buf``
            k = len(buf) // T
            trace.domains[domain] = (rows, buf, doc_at, head_id)
            if k:
                seqs = buf[: k * T].reshape(k, T)
                ends = np.arange(1, k + 1) * T - 1
                done_by.append(rows[np.searchsorted(doc_at, ends, side="right") - 1])
                made.append((domain, seqs, [trace.sample_id(domain, j * T, head_id) for j in range(k)]))
            rest = k * T
            if rest < len(buf):
                self._carry[domain] = (buf[rest:].copy(), trace.sample_id(domain, rest, head_id))
            else:
                self._carry.pop(domain, None)
        self._trace = trace
        if not made:
            return []
        completing = np.concatenate(done_by)
        order = np.argsort(completing, kind="stable")
        trace.done_by = completing[order]
        flat = [(domain, seqs[j], ids[j]) for domain, seqs, ids in made for j in range(len(ids))]
        return [PackedSequence(flat[i][1], flat[i][0], flat[i][2], T) for i in order]

    def restart_point(
        self, taken: int, before: dict[str, tuple[np.ndarray, str]]
    ) -> tuple[int, int, dict[str, tuple[np.ndarray, str]]] | None:
        """Where to restart inside the last block fed, ``taken`` of its sequences being handed out.

        Returns ``(row, skip, carry)``: re-reading from document ``row`` of that block with the packer
        at ``carry`` and dropping the first ``skip`` sequences gives the sequences after the taken ones.
        ``row`` is the document that completes the next sequence (or the last one completed), so a
        restart reads again at most that document's line onward. ``before`` is the :meth:`snapshot`
        taken before the block. None when the block is not known (restart at the block start).
        """
        trace = self._trace
        if trace is None or taken == 0 or len(trace.done_by) == 0:
            return None
        row = int(trace.done_by[min(taken, len(trace.done_by) - 1)])
        skip = taken - int(np.searchsorted(trace.done_by, row, side="left"))
        carry = dict(before)
        T = self.seq_len
        for domain, (rows, buf, doc_at, head_id) in trace.domains.items():
            m = int(np.searchsorted(rows, row, side="left"))  # this domain's documents before ``row``
            end = int(doc_at[m]) if m < len(rows) else len(buf)
            start = (end // T) * T
            if end > start:
                carry[domain] = (buf[start:end].copy(), trace.sample_id(domain, start, head_id))
            else:
                carry.pop(domain, None)
        return row, skip, carry

    def flush(self, domain_order: Iterable[str] | None = None) -> list[PackedSequence]:
        """Emit each domain's partial sequence, right-padded with EOS, and empty the buffers.

        Args:
            domain_order: the order of domains in the output (default: sorted); domains not
                listed follow, sorted.
        """
        order = list(domain_order or [])
        order += sorted(set(self._carry) - set(order))
        out = []
        for domain in order:
            if domain not in self._carry:
                continue
            carried, head_id = self._carry[domain]
            seq = np.full(self.seq_len, self.eos_id, dtype=np.int32)
            seq[: len(carried)] = carried
            out.append(PackedSequence(seq, domain, head_id, len(carried)))
        self._carry.clear()
        return out

    def pending_tokens(self) -> dict[str, int]:
        """Tokens waiting in each domain's buffer."""
        return {d: len(t) for d, (t, _) in self._carry.items()}

    def snapshot(self) -> dict[str, tuple[np.ndarray, str]]:
        """The carried tokens now (cheap: arrays are shared, never changed in place); see :meth:`state`."""
        return dict(self._carry)

    @staticmethod
    def state_of(snapshot: dict[str, tuple[np.ndarray, str]]) -> dict[str, Any]:
        """JSON-safe state of a :meth:`snapshot`: ``{domain: [base64 int32 tokens, head sample id]}``."""
        return {d: [encode_tokens(t), head] for d, (t, head) in sorted(snapshot.items())}

    def state(self) -> dict[str, Any]:
        return self.state_of(self._carry)

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state` (replaces the buffers)."""
        carry = {}
        for domain, (tokens, head) in state.items():
            arr = decode_tokens(tokens)
            if not 0 < len(arr) < self.seq_len:
                raise ValueError(f"packer state of domain {domain!r} holds {len(arr)} tokens; expected 1..{self.seq_len - 1}")
            carry[domain] = (arr, str(head))
        self._carry = carry
