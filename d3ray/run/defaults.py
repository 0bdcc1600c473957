"""Run defaults the commands and the studies share; no imports, so that ``d3ray --help`` stays fast."""

from __future__ import annotations

#: The embedded ``d3ray finetune`` default: the tiny model on the generated skill suite (digit copy →
#: addition → multiplication, sorting, reversal, word problems), response-only loss, exact match on the
#: held-out split at the end. Dotted overrides and ``--config`` files apply on top.
FINETUNE_DEFAULTS = [
    "--name=d3ray-sft-tiny", "--sft={seq_len: 64}", "--data.seq_len=64", "--data.tokenizer.vocab_size=512",
    "--train.steps=240", "--train.lr=0.001", "--train.warmup_steps=20", "--train.eval_every=0",
    "--eval.max_sequences_per_domain=32", "--eval.tasks=sft={suite}/test",
]
