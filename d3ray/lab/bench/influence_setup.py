"""Inputs of ``d3ray bench influence``: real text through the project's reader, and trained weights.

- Sequences: the RedPajama sample (``--data``, default ``../shared/data/redpajama_sample/slimpajama_format``)
  read, tokenized and packed by :mod:`d3ray.data` exactly as the trainers' evaluation sets are
  (``list_shards`` → ``ensure_tokenizer`` → ``load_eval_sequences``); the ``train`` split trains the
  weights, the ``validation`` split provides the scored chunks. Batches mix domains, as pre-training does.
- Weights: a preset of :mod:`d3ray.model` (``build_model``) trained with AdamW using the trainers'
  hyperparameters (``TrainConfig`` defaults, its warmup + cosine ``lr_factor``, gradient clipping),
  snapshotted with the optimizer state (:class:`~d3ray.influence.optimizer.AdamWState`) after each
  requested number of steps, and cached under the work directory (training once serves later runs).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

#: Bench model name → preset of d3ray.model.
PRESET_OF = {"tiny": "gpt2-tiny", "small": "gpt2-small"}
DEFAULT_DATA = Path("../shared/data/redpajama_sample/slimpajama_format")


@dataclass(frozen=True)
class Corpus:
    """Packed sequences per domain of one split, and the tokenizer's vocabulary size / EOS id."""

    train: dict[str, np.ndarray]
    heldout: dict[str, np.ndarray]
    vocab_size: int
    eos_id: int


def load_corpus(data: Path, workdir: Path, vocab_size: int, seq_len: int, per_domain: int) -> Corpus:
    """Tokenize (once; the tokenizer is cached in ``workdir``) and pack the sample's two splits."""
    from d3ray.data import DataConfig, TokenizerConfig, ensure_tokenizer, list_shards, load_eval_sequences
    from d3ray.data.tokenizer import load_backend_tokenizer

    if not (data / "train").is_dir() or not (data / "validation").is_dir():
        raise FileNotFoundError(
            f"{data} must hold train/ and validation/ in SlimPajama layout (pass --data); see "
            "d3ray/data/README.md ('Bring your own data')"
        )
    cfg = DataConfig(
        train_paths=[str(data / "train")],
        validation_paths=[str(data / "validation")],
        layout="slimpajama",
        seq_len=seq_len,
        tokenizer=TokenizerConfig(vocab_size=vocab_size),
    )
    tok_dir = ensure_tokenizer(cfg, list_shards(cfg.train_paths), workdir / f"vocab{vocab_size}")
    backend, eos_id = load_backend_tokenizer(tok_dir)
    train = load_eval_sequences(cfg.train_paths, cfg, tok_dir, per_domain)
    heldout = load_eval_sequences(cfg.validation_paths, cfg, tok_dir, per_domain)
    return Corpus(train=train, heldout=heldout, vocab_size=backend.get_vocab_size(), eos_id=eos_id)


def mixed_batches(
    seqs: dict[str, np.ndarray], n: int, batch_size: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """n batches (b, T) int64, each sequence from a domain drawn in proportion to the domain's size."""
    domains = sorted(seqs)
    sizes = np.array([len(seqs[d]) for d in domains], dtype=np.float64)
    out = []
    for _ in range(n):
        picks = rng.choice(len(domains), size=batch_size, p=sizes / sizes.sum())
        out.append(np.stack([seqs[domains[d]][rng.integers(len(seqs[domains[d]]))] for d in picks]).astype(np.int64))
    return out


def model_config(model: str, corpus: Corpus, seq_len: int) -> dict[str, Any]:
    """The transformers config dict of a bench model (a d3ray.model preset at this vocabulary)."""
    from d3ray.model import ModelConfig, model_config_dict

    return model_config_dict(ModelConfig(preset=PRESET_OF[model]), corpus.vocab_size, seq_len, corpus.eos_id)


@dataclass(frozen=True)
class TrainedWeights:
    """A weights snapshot after ``steps`` AdamW steps, its optimizer state and the training loss."""

    steps: int
    weights: dict[str, np.ndarray]
    optimizer: Any  # AdamWState
    loss: float


def train_config(steps: int, schedule_steps: int) -> Any:
    """The trainers' defaults (lr, betas, weight decay, clipping, warmup), cosine horizon ``schedule_steps``."""
    from d3ray.train.config import TrainConfig

    return replace(TrainConfig(), steps=max(steps, schedule_steps))


def trained_weights(
    model: str, steps: list[int], corpus: Corpus, cfg_dict: dict[str, Any], batch_size: int,
    schedule_steps: int, workdir: Path, seed: int = 0,
) -> dict[int, TrainedWeights]:
    """Snapshots after each of ``steps`` steps of one training run, cached in ``workdir/weights``."""
    import torch

    from d3ray.influence.optimizer import AdamWState
    from d3ray.model import ModelConfig, build_model
    from d3ray.train.deepspeed_config import lr_factor

    key = hashlib.blake2b(
        json.dumps([cfg_dict, batch_size, schedule_steps, seed, corpus.vocab_size], sort_keys=True).encode(),
        digest_size=6,
    ).hexdigest()
    cache = workdir / "weights"
    paths = {s: cache / f"{model}_{key}_{s}.pt" for s in steps}
    if all(p.is_file() for p in paths.values()):
        return {s: _load(p) for s, p in paths.items()}
    tcfg = train_config(max(steps), schedule_steps)
    torch.manual_seed(seed)
    net = build_model(cfg_dict, ModelConfig(preset=PRESET_OF[model])).train()
    opt = torch.optim.AdamW(net.parameters(), lr=tcfg.lr, betas=tcfg.betas, weight_decay=tcfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, tcfg))
    rng = np.random.default_rng(seed + 12345)
    out, started, losses = {}, time.perf_counter(), []
    for step in range(1, max(steps) + 1):
        x = torch.from_numpy(mixed_batches(corpus.train, 1, batch_size, rng)[0])
        loss = net(input_ids=x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), tcfg.grad_clip)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if step % 100 == 0:
            logger.info("[%s] step %d loss %.3f (%.0fs)", model, step, np.mean(losses[-100:]), time.perf_counter() - started)
        if step in paths:
            snap = TrainedWeights(
                steps=step,
                # np.array copies: .numpy() is a view of the live parameter, which training goes on changing
                weights={k: np.array(v.detach().float().cpu().numpy()) for k, v in net.state_dict().items()},
                optimizer=AdamWState.from_torch(opt, net.named_parameters(), max_grad_norm=tcfg.grad_clip),
                loss=float(np.mean(losses[-20:])),
            )
            paths[step].parent.mkdir(parents=True, exist_ok=True)
            torch.save(snap.__dict__ | {"optimizer": snap.optimizer.__dict__}, paths[step])
            out[step] = snap
    return out


def _load(path: Path) -> TrainedWeights:
    from d3ray.influence.optimizer import AdamWState
    from d3ray.safe_load import load_data

    raw = load_data(path)
    from d3ray.train.config import TrainConfig

    opt = {"max_grad_norm": TrainConfig().grad_clip, **raw["optimizer"]}  # older caches lack the clip
    return TrainedWeights(
        steps=raw["steps"], weights=raw["weights"], optimizer=AdamWState(**opt), loss=raw["loss"]
    )
