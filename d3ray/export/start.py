"""A run that starts from a checkpoint (``d3ray finetune --from``, a comparison arm's ``init_from``)."""

from __future__ import annotations

from pathlib import Path


def start_from(cfg, source: Path):
    """The run, starting from ``source`` (a run directory means its newest checkpoint): exported once
    into ``<run_dir>/init_model`` (a Hugging Face directory with its tokenizer), which the model and the
    tokenizer then load from."""
    import dataclasses

    from d3ray.errors import DataPathError
    from d3ray.export.load import resolve_model_source
    from d3ray.export.write import export_model

    if not source.exists():
        raise DataPathError(f"--from {source}: no such checkpoint, run directory or model directory")
    resolved = resolve_model_source(source)
    if resolved != source:
        print(f"--from {source}: starting from its newest checkpoint {resolved}", flush=True)
    target = cfg.run_dir / "init_model"
    if not (target / "config.json").exists():
        export_model(resolved, target)
    model = dataclasses.replace(cfg.model, pretrained_path=str(target))
    tokenizer = dataclasses.replace(cfg.data.tokenizer, path=str(target))
    return dataclasses.replace(cfg, model=model, data=dataclasses.replace(cfg.data, tokenizer=tokenizer))
