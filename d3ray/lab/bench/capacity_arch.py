"""Architectures of the capacity model (GPT-2 124M, 1B, 7B, 70B): parameters, FLOPs and activations.

Pure functions of a transformer's shape, used by :mod:`d3ray.lab.bench.capacity_model`. The shapes are
the published ones (cited per preset) and the counts are exact for the Hugging Face implementations
(``tests/lab/test_capacity_model.py`` checks them against real ``transformers`` models):

    GPT-2 (Radford et al. 2019; HF GPT2LMHeadModel, tied lm_head, learned positions, biases):
        N = V·h + T·h + l·(4h² + 2h·f + 9h + f) + 2h                       (f = 4h: 12h² + 13h per layer)
    Llama (Touvron et al. 2023; HF LlamaForCausalLM, RMSNorm, SwiGLU, grouped KV, no biases):
        N = V·h·(1 or 2 when untied) + l·(2h² + 2h·h_kv + 3h·f + 2h) + h,  h_kv = h · kv_heads / heads

FLOPs per trained token (PaLM, Chowdhery et al. 2022, appendix B): 6·N_mm + 12·l·h·T, where N_mm
counts the parameters that enter a matrix multiply per token (every parameter except lookup-only
embedding tables: GPT-2's position table, and the input embedding of an untied Llama) and 12·l·h·T
is the attention score/value product (forward + backward, no causal discount).

Activation bytes of one sequence, 16-bit, no recomputation (Korthikanti et al. 2022, "Reducing
Activation Recomputation in Large Transformer Models", eq. 1 and its a·T/h attention term):

    per layer T·h·(34 + 5·a·T/h)   (eager attention keeps the a·T² scores; flash/SDPA drops the 5·a·T/h term)

plus the logits, T·V·8 bytes (float32 logits and their gradient; the loss is taken in float32).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ARCHITECTURES",
    "Architecture",
    "activation_bytes",
    "architecture_of",
    "largest_tensor",
    "matmul_params",
    "param_count",
    "tied_copy",
    "train_flops_per_token",
]


@dataclass(frozen=True, kw_only=True)
class Architecture:
    """The shape of a decoder-only transformer, and the batch it is trained with."""

    name: str
    """Label in tables and JSON (e.g. ``gpt2-124m``)."""
    family: str
    """``gpt2`` (learned positions, biases, tied lm_head) or ``llama`` (RMSNorm, SwiGLU, grouped KV)."""
    layers: int
    """l: transformer blocks."""
    hidden: int
    """h: model width."""
    heads: int
    """a: attention heads."""
    kv_heads: int
    """Key/value heads (grouped-query attention; = heads without it)."""
    ffn: int
    """f: MLP inner width (GPT-2: 4h; Llama: the SwiGLU width)."""
    vocab: int
    """V: vocabulary size."""
    seq_len: int
    """T: training context (and GPT-2's position table)."""
    tied_embeddings: bool
    """lm_head shares the input embedding (GPT-2, Llama-3.2-1B)."""
    batch_sequences: int
    """B: sequences per global batch (the assumed training batch, ``source``)."""
    micro_batch: int
    """Sequences per forward+backward of an influence actor (gradient accumulated over the rest)."""
    source: str
    """Where the shape and the batch come from."""

    def __post_init__(self) -> None:
        if self.family not in ("gpt2", "llama"):
            raise ValueError(f"family must be 'gpt2' or 'llama', got {self.family!r}")
        for name in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq_len", "batch_sequences",
                     "micro_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ValueError(f"hidden={self.hidden}, heads={self.heads}, kv_heads={self.kv_heads} do not divide")


def param_count(arch: Architecture) -> int:
    """N: all parameters (module docstring for the two formulas)."""
    V, T, h, f, n = arch.vocab, arch.seq_len, arch.hidden, arch.ffn, arch.layers
    if arch.family == "gpt2":
        # c_attn h·3h+3h, attn.c_proj h²+h, c_fc h·f+f, mlp.c_proj f·h+h, ln_1 and ln_2 2h each
        per_layer = 4 * h * h + 2 * h * f + 9 * h + f
        embeddings = V * h + T * h + (0 if arch.tied_embeddings else V * h)
        return embeddings + n * per_layer + 2 * h
    h_kv = h * arch.kv_heads // arch.heads
    per_layer = 2 * h * h + 2 * h * h_kv + 3 * h * f + 2 * h  # q, o; k, v; gate, up, down; 2 RMSNorms
    return V * h * (1 if arch.tied_embeddings else 2) + n * per_layer + h


def tied_copy(arch: Architecture) -> int:
    """Numbers a state dict holds beyond N: a tied lm_head is a second key of the same V·h tensor, and
    ``state_dict()`` (what the trainers ship, ``d3ray.train.scheduling.snapshot.snapshot_weights``) keeps both."""
    return arch.vocab * arch.hidden if arch.tied_embeddings else 0


def largest_tensor(arch: Architecture) -> int:
    """Numbers in the largest parameter tensor: the embedding V·h, an MLP matrix h·f, GPT-2's fused
    c_attn h·3h or its position table T·h."""
    h = arch.hidden
    candidates = [arch.vocab * h, h * arch.ffn]
    if arch.family == "gpt2":
        candidates += [3 * h * h, arch.seq_len * h]
    return max(candidates)


def matmul_params(arch: Architecture) -> int:
    """N_mm: parameters in a matrix multiply per token: N minus the lookup-only embedding tables."""
    lookup = arch.seq_len * arch.hidden if arch.family == "gpt2" else 0  # GPT-2's position table
    if not arch.tied_embeddings:
        lookup += arch.vocab * arch.hidden  # the input embedding; the separate lm_head multiplies
    return param_count(arch) - lookup


def train_flops_per_token(arch: Architecture) -> float:
    """Forward + backward FLOPs per token: 6·N_mm + 12·l·h·T (PaLM appendix B)."""
    return 6.0 * matmul_params(arch) + 12.0 * arch.layers * arch.hidden * arch.seq_len


def activation_bytes(arch: Architecture, sequences: int, *, eager_attention: bool, bytes_per_value: int = 2) -> float:
    """Bytes of activations kept for the backward of ``sequences`` sequences (Korthikanti et al. 2022).

    Args:
        arch: the architecture (l, h, a, T, V).
        sequences: sequences in one forward+backward.
        eager_attention: keep the a·T² attention scores (eager kernels; flash/SDPA recompute them).
        bytes_per_value: 2 for 16-bit compute; 4 for float32 (the formula's 34 counts 16-bit values).
    """
    T, h, a = arch.seq_len, arch.hidden, arch.heads
    per_token = 34.0 + (5.0 * a * T / h if eager_attention else 0.0)
    layers = arch.layers * T * h * per_token * bytes_per_value / 2.0
    logits = T * arch.vocab * 8.0  # float32 logits + their gradient
    return sequences * (layers + logits)


def architecture_of(config: dict, *, name: str, batch_sequences: int, micro_batch: int, seq_len: int) -> Architecture:
    """The Architecture of a transformers config dict (``d3ray.model.model_config_dict``), GPT-2 or Llama."""
    if config["model_type"] == "gpt2":
        h = config["n_embd"]
        return Architecture(
            name=name, family="gpt2", layers=config["n_layer"], hidden=h, heads=config["n_head"],
            kv_heads=config["n_head"], ffn=config.get("n_inner") or 4 * h, vocab=config["vocab_size"],
            seq_len=config["n_positions"], tied_embeddings=config.get("tie_word_embeddings", True),
            batch_sequences=batch_sequences, micro_batch=micro_batch, source="transformers config",
        )
    if config["model_type"] == "llama":
        return Architecture(
            name=name, family="llama", layers=config["num_hidden_layers"], hidden=config["hidden_size"],
            heads=config["num_attention_heads"], kv_heads=config.get("num_key_value_heads") or config["num_attention_heads"],
            ffn=config["intermediate_size"], vocab=config["vocab_size"], seq_len=seq_len,
            tied_embeddings=config.get("tie_word_embeddings", False), batch_sequences=batch_sequences,
            micro_batch=micro_batch, source="transformers config",
        )
    raise ValueError(f"no capacity formula for model_type {config['model_type']!r} (gpt2, llama)")


#: The four sizes of the capacity table. Batches: GPT-2's 0.5M tokens (nanoGPT's reproduction), 1M for
#: 1B, Llama 2's 4M tokens for 7B and 70B. The influence micro-batch keeps an actor's activations below
#: about 20 GB (16-bit, flash attention).
ARCHITECTURES: dict[str, Architecture] = {
    arch.name: arch
    for arch in (
        Architecture(
            name="gpt2-124m", family="gpt2", layers=12, hidden=768, heads=12, kv_heads=12, ffn=3072,
            vocab=50257, seq_len=1024, tied_embeddings=True, batch_sequences=512, micro_batch=16,
            source="GPT-2 small (Radford et al. 2019; HF gpt2); batch 512 x 1024 = 0.5M tokens (nanoGPT)",
        ),
        Architecture(
            name="llama-1b", family="llama", layers=16, hidden=2048, heads=32, kv_heads=8, ffn=8192,
            vocab=128256, seq_len=2048, tied_embeddings=True, batch_sequences=512, micro_batch=4,
            source="Llama-3.2-1B shape (d3ray preset llama-1b); batch 512 x 2048 = 1M tokens (assumed)",
        ),
        Architecture(
            name="llama-7b", family="llama", layers=32, hidden=4096, heads=32, kv_heads=32, ffn=11008,
            vocab=32000, seq_len=4096, tied_embeddings=False, batch_sequences=1024, micro_batch=1,
            source="Llama-2-7B (Touvron et al. 2023); batch 1024 x 4096 = 4M tokens (Llama 2)",
        ),
        Architecture(
            name="llama-70b", family="llama", layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672,
            vocab=128256, seq_len=4096, tied_embeddings=False, batch_sequences=1024, micro_batch=1,
            source="Llama-3-70B shape (Meta 2024; GQA 8 KV heads); batch 1024 x 4096 = 4M tokens (Llama 2)",
        ),
    )
}
