"""CensusWorker without Ray (a one-rank gloo group in this process): a branch restores the checkpoint's
whole state (the same order twice gives the same losses), and a checkpoint whose weights hold a NaN gives
a branch reported as failed, while the next branch trains; ``persist`` evaluates again after a shared chunk."""

from __future__ import annotations

import math

import numpy as np
import torch

from d3ray.config import RunConfig
from d3ray.config_loading import load_config
from d3ray.data.chunker import GlobalBatch
from d3ray.lab.census.worker import BranchTask, CensusWorker, ChunkData
from d3ray.model import model_config_dict
from d3ray.train.checkpoint import TrainState, save_checkpoint

VOCAB, T, B = 64, 16, 4


def batch(seed: int) -> GlobalBatch:
    ids = np.random.default_rng(seed).integers(1, VOCAB, size=(B, T)).astype(np.int32)
    return GlobalBatch(input_ids=ids, n_tokens=np.full(B, T, dtype=np.int32), sample_ids=tuple(f"{seed}/{i}" for i in range(B)),
                       domains=("a",) * B)


def test_census_worker_same_order_twice_identical_and_nan_checkpoint_branch_failed(process_group, tmp_path):
    cfg = load_config(RunConfig, None, ["--train.zero_stage=0", "--train.num_workers=1", f"--train.global_batch_size={B}",
                                        "--train.micro_batch_size=2", "--train.steps=8", "--train.warmup_steps=2",
                                        "--schedule.type=random", "--schedule.L=2"])
    model_config = model_config_dict(cfg.model, VOCAB, T, 0)
    eval_sets = {"a": np.random.default_rng(9).integers(1, VOCAB, size=(4, T)).astype(np.int32)}
    worker = CensusWorker(cfg, model_config, eval_sets)
    chunk = ChunkData(chunk_id=1, batches=[batch(1), batch(2)], run_order=(1, 0))
    good, bad = tmp_path / "good", tmp_path / "bad"
    save_checkpoint(worker.engine, TrainState(step=2, next_chunk=1), good, 0, None)
    with torch.no_grad():
        next(worker.engine.module.parameters()).fill_(float("nan"))
    save_checkpoint(worker.engine, TrainState(step=2, next_chunk=1), bad, 0, None)

    first = worker.branch(BranchTask(checkpoint=str(good), chunk=chunk, order=(0, 1), names=("stream",)))
    other = worker.branch(BranchTask(checkpoint=str(good), chunk=chunk, order=(1, 0), names=("run",)))
    again = worker.branch(BranchTask(checkpoint=str(good), chunk=chunk, order=(0, 1), names=("random_0",)))
    assert first["status"] == "ok" and math.isfinite(first["eval"]["mean_loss"])
    assert again["train_losses"] == first["train_losses"] and again["eval"] == first["eval"]
    assert other["eval"]["mean_loss"] != first["eval"]["mean_loss"]

    failed = worker.branch(BranchTask(checkpoint=str(bad), chunk=chunk, order=(0, 1), names=("d3",)))
    assert failed["status"] == "failed" and "non-finite training loss at step 1" in failed["reason"]
    after = worker.branch(BranchTask(checkpoint=str(good), chunk=chunk, order=(0, 1), names=("stream",)))
    assert after["status"] == "ok" and after["train_losses"] == first["train_losses"]

    # --persist: the branch, then a chunk shared by every branch in its run order, evaluated again
    shared = ChunkData(chunk_id=2, batches=[batch(3), batch(4)], run_order=(1, 0))
    persisted = worker.branch(BranchTask(checkpoint=str(good), chunk=chunk, order=(0, 1), names=("stream",),
                                         persist=(shared,)))
    assert persisted["eval"] == first["eval"] and persisted["persist_eval"]["mean_loss"] != first["eval"]["mean_loss"]
