"""The cost side of ``d3ray bench influence``: worker seconds per scored batch over one training step.

Each (estimator, preconditioner) at a fraction/filter is timed in a fresh spawned process, together with
one training step (forward + backward + AdamW, float32) in that same process; ``*_shared`` variants cost
g per batch plus the h estimate once per chunk (:func:`attach_costs`).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import numpy as np

from d3ray.lab.bench.influence_variants import estimator_config, preconditioners, variant_label


def cost_variants(records, model, cfg_dict, parts, batches, base, todo, args) -> None:
    """Seconds per batch of each (estimator, preconditioner) at this fraction/filter, over a training step."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    configs = {}
    for est, n in todo:
        for pre in preconditioners(est):
            configs[(variant_label(est, n), pre)] = replace(base, estimator=estimator_config(est, n), preconditioner=pre)
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        timed = pool.submit(_cost_in_process, cfg_dict, parts, batches, configs, args.threads, args.device).result()
    for rec in records:
        if rec["model"] != model or rec["sample_fraction"] != base.sample_fraction:
            continue
        if rec["param_filter"] != (base.param_filter or "none"):
            continue
        key = (rec["variant"].removesuffix("_shared"), rec["preconditioner"])
        if key in timed:
            rec["sec_per_batch"], rec["step_sec"] = timed[key]
            rec["cost_estimator"] = key[0]


def _cost_in_process(cfg_dict, parts, batches, configs, threads, device="cpu"):
    """In a fresh process: one training step's time, then each config's worker seconds per batch, both on
    ``device`` (on CUDA each timing ends after a device synchronise)."""
    import torch

    from d3ray.influence.worker import InfluenceWorker
    from d3ray.model import ModelConfig, build_model

    if threads:
        torch.set_num_threads(threads)
    net = build_model(cfg_dict, ModelConfig(attn_implementation="eager")).train()
    net.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in parts[0].items()}, strict=False)
    net.to(device)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4)

    def sync() -> None:
        if device != "cpu":
            torch.cuda.synchronize()

    steps = []
    for b in batches * 3:
        x = torch.from_numpy(b).to(device)
        sync()
        t0 = time.perf_counter()
        loss = net(input_ids=x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        sync()
        steps.append(time.perf_counter() - t0)
    step_sec = float(np.min(steps))  # the least disturbed, as for the worker calls on a shared machine
    out = {}
    ids = list(range(len(batches)))
    for key, config in configs.items():
        worker = InfluenceWorker(cfg_dict, config)
        worker.load_weights(parts)
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            worker.sketch_batches(parts, batches, ids)
            sync()
            times.append((time.perf_counter() - t0) / len(batches))
        out[key] = (float(min(times)), step_sec)
    return out


def attach_costs(records: list[dict[str, Any]], L: int) -> None:
    """Cost ratios (timed on the last weights) onto every record; ``*_shared`` = g + h once per chunk."""
    timed = {
        (r["model"], r["sample_fraction"], r["param_filter"], r["cost_estimator"], r["preconditioner"]):
        (r["sec_per_batch"], r["step_sec"]) for r in records if "sec_per_batch" in r
    }
    for r in records:
        key = (r["model"], r["sample_fraction"], r["param_filter"], r["variant"].removesuffix("_shared"),
               r["preconditioner"])
        if key not in timed:
            r["cost_ratio"] = None
            continue
        sec, step = timed[key]
        if r["variant"].endswith("_shared"):
            first = timed.get(key[:3] + ("first_order", r["preconditioner"]))
            sec = first[0] + (sec - first[0]) / L if first else sec
        r["cost_ratio"] = sec / step
        r["sec_per_batch_all"] = sec
