"""``CensusWorker``: one process, one DeepSpeed engine, many branches from one loaded checkpoint.

    load(checkpoint)  once per checkpoint: weights, AdamW m and v, LR schedule position, step counters and
                      rank 0's RNG (engine.load_checkpoint at ZeRO-0; ZeRO 1-3 shards merged by restore.py),
                      then an in-memory copy of all of it
    orders(chunk)     D3's S at the checkpoint weights (the run's influence config, and the exact
                      look-ahead), solved by the run's solver ─► the orders to branch on
    branch(order)     restore the copy ─► train the chunk's batches in ``order`` with the trainer's own
                      step (d3ray.train.loop.train_step) ─► held-out loss ─► (optionally) T more chunks
                      in the run's own orders ─► held-out loss again

The engine is world size 1 (gloo, or NCCL on a GPU) with gradient accumulation over the whole global
batch: the micro-batches are the trainer's (rows ``[k·m, (k+1)·m)`` of the global batch whatever the
number of ranks, d3ray/train/loop.py), DeepSpeed averages the accumulated gradients as the ranks'
all-reduce does, so a branch in the run's own order reproduces the run's next checkpoint (up to the
order of floating-point sums; ``tests/lab/test_census.py`` checks it).

A plain class (docs/design/conventions.md §3): ``command.py`` wraps it with ``ray.remote`` where it is created.
"""

from __future__ import annotations

import copy
import logging
import math
import os
import random
import socket
import time
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from d3ray.config import RunConfig
from d3ray.ray_refs import is_object_ref
from d3ray.train.trainer_rank import TrainerRank

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChunkData:
    """One chunk of the run's stream: its id and its batches in stream order (ObjectRefs, list-wrapped so
    that Ray hands them over unresolved, or ``GlobalBatch`` objects), and the order the run trained it in."""

    chunk_id: int
    batches: list[Any]
    run_order: tuple[int, ...]


@dataclass(frozen=True)
class BranchTask:
    """One branch: ``chunk`` trained in ``order`` from ``checkpoint``, then the ``persist`` chunks (each in
    the run's order); ``compare_to`` = the run's checkpoint right after ``chunk`` (the reproduction check
    of the run's own order), else None."""

    checkpoint: str
    chunk: ChunkData
    order: tuple[int, ...]
    names: tuple[str, ...]
    persist: tuple[ChunkData, ...] = ()
    compare_to: str | None = None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _batches(chunk: ChunkData) -> list[Any]:
    refs = list(chunk.batches)
    if refs and is_object_ref(refs[0]):
        import ray

        return ray.get(refs)  # one call: the batches are fetched together
    return refs


class CensusWorker:
    """Trains branches of a run's chunks from its checkpoints (see the module docstring).

    Args:
        cfg: the run's config (``config.yaml`` of the run directory).
        model_config: the run's transformers config dict.
        eval_sets: name → held-out set (``d3ray.run.prepare.load_eval_sets``), or [ObjectRef of it].
        fault_dir: where a fault drill's ``faults.json`` may lie (the census's out dir; d3ray/faults.py).
    """

    def __init__(self, cfg: RunConfig, model_config: dict[str, Any], eval_sets: Any, fault_dir: str | None = None) -> None:
        import torch

        from d3ray.deepspeed_import import import_deepspeed
        from d3ray.model import build_model
        from d3ray.run_files import stdout_to_log
        from d3ray.train.deepspeed_config import deepspeed_config, lr_factor

        deepspeed = import_deepspeed()

        self.cfg = cfg
        self.fault_dir = fault_dir
        # One rank, accumulation over the whole global batch, ZeRO-0 whatever stage the run trained at: ZeRO 1-3
        # checkpoints are merged into it (restore.py), and its torch AdamW state is what a branch restores.
        self.tcfg = replace(cfg.train, num_workers=1, zero_stage=0,
                            deepspeed={k: v for k, v in cfg.train.deepspeed.items() if k != "zero_optimization"})
        self.model_config = model_config
        if isinstance(eval_sets, list):
            import ray

            eval_sets = ray.get(eval_sets[0]) if eval_sets else {}
        self.eval_sets = eval_sets
        use_gpu = self.tcfg.use_gpu
        if not torch.distributed.is_initialized():  # an actor: its own one-rank group
            os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                               "MASTER_PORT": str(_free_port())})
            with stdout_to_log(logger):
                deepspeed.init_distributed(dist_backend="nccl" if use_gpu else "gloo")
        elif torch.distributed.get_world_size() != 1:
            raise RuntimeError("CensusWorker needs a process of its own (or a one-rank process group)")
        self.device = torch.device("cuda", torch.cuda.current_device()) if use_gpu else torch.device("cpu")
        torch.manual_seed(cfg.seed)
        model = build_model(model_config, cfg.model)
        self.engine, _, _, _ = deepspeed.initialize(
            model=model,
            model_parameters=[p for p in model.parameters() if p.requires_grad],
            config=deepspeed_config(self.tcfg),
            lr_scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, partial(lr_factor, cfg=self.tcfg)),
        )
        self.engine.train()  # as the trainers: a pretrained model trains with its own dropout
        self.trainer = TrainerRank(self.engine, rank=0, world=1, zero_stage=0)  # one rank, ZeRO-0
        self.loaded: str | None = None
        self._base: dict[str, Any] = {}
        self._influence: dict[str, Any] = {}

    # ---- state ------------------------------------------------------------------------------------
    def load(self, checkpoint: str) -> None:
        """Load ``checkpoint`` into the engine (skipped when it is loaded already) and keep a copy."""
        import torch

        from d3ray.lab.census.restore import load_for_census

        if self.loaded == checkpoint:
            return
        engine = self.engine
        load_for_census(engine, Path(checkpoint))  # any ZeRO stage, any number of ranks (restore.py)
        self._base = {
            "module": copy.deepcopy(engine.module.state_dict()),
            "optimizer": copy.deepcopy(engine.optimizer.state_dict()),
            "lr_scheduler": copy.deepcopy(engine.lr_scheduler.state_dict()),
            "counters": (engine.global_steps, engine.global_samples, engine.micro_steps, engine.skipped_steps),
            "rng": (torch.get_rng_state(), np.random.get_state(), random.getstate()),
        }
        self.loaded = checkpoint

    def restore(self) -> None:
        """Back to the loaded checkpoint's state: weights, AdamW state, LR schedule, counters, RNG.
        Deep copies: torch's ``load_state_dict`` keeps tensors it is given, and the step updates them."""
        import torch

        engine, base = self.engine, self._base
        engine.module.load_state_dict(base["module"])
        engine.optimizer.load_state_dict(copy.deepcopy(base["optimizer"]))
        engine.lr_scheduler.load_state_dict(copy.deepcopy(base["lr_scheduler"]))
        engine.global_steps, engine.global_samples, engine.micro_steps, engine.skipped_steps = base["counters"]
        engine.zero_grad()
        torch_rng, np_rng, py_rng = base["rng"]
        torch.set_rng_state(torch_rng)
        np.random.set_state(np_rng)
        random.setstate(py_rng)

    # ---- D3's orders ------------------------------------------------------------------------------
    def orders(self, checkpoint: str, chunk: ChunkData, influence: Any, solver: Any, solver_seed: int,
               snapshot_dtype: str, lookahead: bool) -> dict[str, Any]:
        """S of the chunk at the checkpoint weights (the run's influence config; and with ``lookahead``
        the exact look-ahead's), each solved by ``solver`` as the run's D3 scheduler solves it.

        Returns:
            ``{"checkpoint", "chunk_id", "S": L×L list, "d3": order, "lookahead_S", "lookahead",
            "batch_domains": each batch's domain labels, "seconds"}`` (the look-ahead keys only with
            ``lookahead``; an order is None when S is not finite).
        """
        from d3ray.data.labels import lm_labels
        from d3ray.influence.estimators import LookaheadConfig
        from d3ray.influence.worker import InfluenceWorker
        from d3ray.train.scheduling.snapshot import snapshot_optimizer_state, snapshot_weights

        start = time.perf_counter()
        self.load(checkpoint)
        self.restore()
        batches = _batches(chunk)
        L = len(batches)
        ids = [chunk.chunk_id * L + i for i in range(L)]  # the run's global batch ids (full chunks)
        inputs = [{"input_ids": np.asarray(b.input_ids, dtype=np.int64),
                   "labels": lm_labels(np.asarray(b.input_ids, dtype=np.int64), b.n_tokens, b.loss_mask)}
                  for b in batches]
        out: dict[str, Any] = {"checkpoint": checkpoint, "chunk_id": chunk.chunk_id}
        configs = [("d3", influence)]
        if lookahead:
            configs.append(("lookahead", replace(influence, estimator=LookaheadConfig())))
        for name, config in configs:
            parts: list[Any] = [snapshot_weights(self.trainer, snapshot_dtype)]
            if config.needs_optimizer_state:
                parts.append(snapshot_optimizer_state(self.trainer, snapshot_dtype))
            key = repr(config)
            if key not in self._influence:
                self._influence[key] = InfluenceWorker(self.model_config, config, self.cfg.model.lora)
            worker = self._influence[key]
            if config.estimator.is_exact_lookahead:
                part = worker.lookahead_matrix(parts, inputs, ids)
            else:
                part = worker.sketch_batches(parts, inputs, ids)
            _, S, _ = config.estimator.merge([part], ids)
            S = np.asarray(S, dtype=np.float64)
            out[f"{name}_S" if name != "d3" else "S"] = S.tolist()
            if np.isfinite(S).all():
                result = solver.build().solve(S, seed=solver_seed * 1_000_003 + chunk.chunk_id)
                out[name] = [int(i) for i in result.order]
            else:
                out[name] = None
        out["batch_domains"] = [list(b.domains) for b in batches]
        out["seconds"] = time.perf_counter() - start
        return out

    # ---- branches ---------------------------------------------------------------------------------
    def _train_chunk(self, batches: list[Any], order: tuple[int, ...]) -> list[float]:
        from d3ray.train.loop import train_step

        B = self.tcfg.global_batch_size
        losses = []
        for position in order:
            stats = train_step(self.engine, batches[position], slice(0, B), self.tcfg.micro_batch_size, self.device,
                               lambda rows, seq_losses: None)
            loss = float(stats[0].item())
            losses.append(loss)
            if not math.isfinite(loss):
                break
        return losses

    def _evaluate(self) -> dict[str, float]:
        from d3ray.train.evaluation import evaluate

        result = evaluate(self.trainer, self.eval_sets, self.tcfg.micro_batch_size, self.device)
        return {k[len("eval/"):]: v for k, v in result.items() if k.endswith("loss") or k.endswith("loss_se")}

    def branch(self, task: BranchTask) -> dict[str, Any]:
        """Train one branch (see :class:`BranchTask`); a non-finite training loss ends it as failed.

        Returns:
            ``{"status": "ok" | "failed", "train_losses", "eval": {"<set>/loss", "mean_loss", ...},
            "persist_eval": {...} (with ``persist``), "reproduction": {...} (with ``compare_to``),
            "seconds", "cpu_seconds"}`` (this process's CPU time: the branch's cost on a quiet core).
        """
        from d3ray.faults import inject

        inject(self.fault_dir, "census_branch", names=task.names)
        start, cpu_start = time.perf_counter(), time.process_time()
        self.load(task.checkpoint)
        self.restore()
        out: dict[str, Any] = {"checkpoint": task.checkpoint, "chunk_id": task.chunk.chunk_id,
                               "order": list(task.order), "names": list(task.names)}
        losses = self._train_chunk(_batches(task.chunk), task.order)
        out["train_losses"] = losses
        if not all(math.isfinite(x) for x in losses):
            out.update(status="failed", reason=f"non-finite training loss at step {len(losses)} of the chunk",
                       seconds=time.perf_counter() - start)
            return out
        out["eval"] = self._evaluate()
        if task.compare_to is not None:
            out["reproduction"] = self._compare(task.compare_to)
        for extra in task.persist:
            more = self._train_chunk(_batches(extra), extra.run_order)
            if not all(math.isfinite(x) for x in more):
                out.update(status="failed", reason=f"non-finite training loss in persist chunk {extra.chunk_id}",
                           seconds=time.perf_counter() - start)
                return out
        if task.persist:
            out["persist_eval"] = self._evaluate()
        out.update(status="ok", seconds=time.perf_counter() - start, cpu_seconds=time.process_time() - cpu_start)
        return out

    def _compare(self, checkpoint: str) -> dict[str, Any]:
        """The engine's weights against a run checkpoint's: max |Δ| and whether every tensor is close at
        float32's default tolerances (``torch.testing.assert_close``: rtol 1.3e-6, atol 1e-5)."""
        import torch

        from d3ray.export.load import deepspeed_state_dict

        reference = deepspeed_state_dict(Path(checkpoint) / "deepspeed")
        own = {k[len("module."):] if k.startswith("module.") else k: v for k, v in self.engine.module.state_dict().items()}
        max_abs, close, compared = 0.0, True, 0
        for name, ref in reference.items():
            name = name[len("module."):] if name.startswith("module.") else name
            if name not in own:
                continue
            a, b = own[name].detach().float().cpu(), ref.detach().float().cpu()
            max_abs = max(max_abs, float((a - b).abs().max()))
            close = close and bool(torch.allclose(a, b, rtol=1.3e-6, atol=1e-5))
            compared += 1
        return {"checkpoint": checkpoint, "max_abs_diff": max_abs, "close": close, "tensors": compared}
