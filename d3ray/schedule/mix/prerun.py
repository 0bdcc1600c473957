"""What a mixer needs done before the main run starts, by the driver after Ray is up: DoReMi's reference
model and RegMix's proxy runs. Both are ordinary d3ray runs (``run_pretrain``, handed in by the driver so
that this package never imports the training driver) with a ``static`` mixture, in their own run
directories under the main run's: ``<run_dir>/doremi/<name>-doremi-reference``,
``<run_dir>/regmix/proxies/<name>-regmix-proxy-NNN``. Each stage writes its result once and a resumed
main run reuses it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PreRunContext:
    """What the driver hands a mixer's ``before_run``."""

    cfg: Any
    """The main ``RunConfig``."""
    data: Any
    """The main run's resolved ``DataConfig`` (train and validation paths, the run's tokenizer as ``tokenizer.path``)."""
    domains: list[str]
    """The mixed domains (``d3ray.schedule.mix.domains.resolve_mix_domains``)."""
    run: Callable[[Any], dict[str, Any]]
    """``run_pretrain``."""
    export: Callable[..., Any]
    """``d3ray.export.write.export_model`` (a checkpoint → a Hugging Face directory): handed down by the
    driver, as ``run`` is, so that the schedule stage imports nothing from the stages above it."""


def sub_run_config(ctx: PreRunContext, name: str, output_dir: Path, steps: int, mixture: dict[str, float],
                   overrides: list[str]) -> Any:
    """A short run of the main run's model and data with a ``static`` mixture (its own run directory)."""
    from d3ray.config_loading import apply_overrides, from_dict, to_dict
    from d3ray.schedule.mix.base_configs import StaticMixConfig

    cfg = ctx.cfg
    schedule = StaticMixConfig(weights=dict(mixture), domains=list(ctx.domains), L=cfg.schedule.L,
                               shuffle_buffer=cfg.schedule.shuffle_buffer, prefetch_chunks=cfg.schedule.prefetch_chunks)
    sub = dataclasses.replace(cfg, name=name, output_dir=str(output_dir), data=ctx.data, schedule=schedule,
                              train=dataclasses.replace(cfg.train, steps=steps, eval_every=0))
    if overrides:
        sub = from_dict(type(cfg), apply_overrides(to_dict(sub), overrides))  # RunConfig (d3ray.config: a layer above)
    return sub


def uniform(domains: list[str]) -> dict[str, float]:
    return {d: 1.0 / len(domains) for d in domains}


def is_hf_model_dir(path: str | Path) -> bool:
    """A Hugging Face model directory (``config.json``), not a d3ray checkpoint (``state.json``)."""
    p = Path(path)
    return (p / "config.json").is_file() and not (p / "state.json").is_file()


def prepare_doremi_reference(mix: Any, ctx: PreRunContext) -> Path:
    """The reference model as a Hugging Face directory: ``reference`` itself when it is one; else exported
    once into ``<run_dir>/doremi/reference_model`` from the d3ray checkpoint ``reference``, or from a
    reference run of ``reference_steps`` steps on ``reference_mixture`` (default uniform) trained first."""
    from d3ray.schedule.mix.doremi import reference_model_dir

    run_dir = ctx.cfg.run_dir
    if mix.reference and is_hf_model_dir(mix.reference):
        return Path(mix.reference)
    target = reference_model_dir(run_dir)
    if (target / "config.json").is_file():
        return target
    if mix.reference:
        print(f"doremi: exporting the reference checkpoint {mix.reference} to {target}", flush=True)
        ctx.export(mix.reference, target)
        return target
    mixture = dict(mix.reference_mixture) or uniform(ctx.domains)
    sub = sub_run_config(ctx, f"{ctx.cfg.name}-doremi-reference", run_dir / "doremi", mix.reference_steps, mixture,
                         list(mix.reference_overrides))
    print(f"doremi: training the reference model ({mix.reference_steps} steps on {mixture}) in {sub.run_dir}",
          flush=True)
    final = ctx.run(sub)
    if not final.get("checkpoint"):
        raise RuntimeError(f"doremi: the reference run {sub.run_dir} left no checkpoint")
    ctx.export(final["checkpoint"], target)
    return target


def prepare_regmix(mix: Any, ctx: PreRunContext) -> dict[str, float]:
    """RegMix's mixture: read (resume), fitted on ``proxy_table``, or fitted on proxy runs launched now."""
    from d3ray.schedule.mix.regmix import (
        choose_from_table,
        chosen_mixture,
        read_proxy_table,
        regmix_dir,
        run_proxies,
        sample_mixtures,
    )

    run_dir, domains, seed = ctx.cfg.run_dir, ctx.domains, ctx.cfg.seed
    done = chosen_mixture(run_dir)
    if done is not None:
        return done
    if mix.proxy_table:
        return choose_from_table(mix, read_proxy_table(mix.proxy_table), domains, seed, run_dir)
    mixtures = sample_mixtures(mix.proxy_runs, len(domains), mix.concentration, seed)
    subs = [sub_run_config(ctx, f"{ctx.cfg.name}-regmix-proxy-{i:03d}", regmix_dir(run_dir) / "proxies",
                           mix.proxy_steps, {d: float(w) for d, w in zip(domains, x, strict=True)},
                           list(mix.proxy_overrides))
            for i, x in enumerate(mixtures)]
    print(f"regmix: {len(subs)} proxy runs of {mix.proxy_steps} steps, {mix.proxy_parallel} at a time", flush=True)
    targets = run_proxies(subs, ctx.run, mix.proxy_parallel, mix.proxy_num_cpus, mix.target)
    table = [{"mixture": sub.schedule.weights, "target": y, "run_dir": str(sub.run_dir)}
             for sub, y in zip(subs, targets, strict=True)]
    return choose_from_table(mix, table, domains, seed, run_dir)
