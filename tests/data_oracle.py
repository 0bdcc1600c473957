"""The packed-sequence stream without Ray, one document at a time: the oracle the Ray Data pipeline
and the chunk stream are checked against (reader → the same tokenizer → packer)."""

from __future__ import annotations

from d3ray.data import SequencePacker, TokenizedDocument, iter_documents
from d3ray.data.tokenizer import encode_texts, load_backend_tokenizer


def reference_sequences(shards, cfg, tok) -> list:
    """Every packed sequence of ``shards`` in stream order, under DataConfig ``cfg`` and tokenizer ``tok``."""
    backend, eos = load_backend_tokenizer(tok)
    packer = SequencePacker(cfg.seq_len, eos)
    out = []
    for shard in shards:
        for doc in iter_documents(shard, cfg.layout, cfg.domains, cfg.max_record_bytes, text_key=cfg.text_key,
                                  domain_key=cfg.domain_key):
            if not doc.is_bad:
                (ids,) = encode_texts(backend, [doc.text])
                out += packer.feed(TokenizedDocument(ids, doc.domain, doc.shard, doc.line))
    return out + packer.flush(cfg.domains)
