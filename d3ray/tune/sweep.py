"""Ray Tune sweeps over whole training runs: one trial = one ``run_pretrain`` (a TorchTrainer fit).

    SweepConfig (YAML) ─► parse + validate the space against RunConfig (before Ray starts)
         │
         ▼
    Tuner(with_resources(train_driver, {CPU: driver_cpus}), param_space, ASHA on eval/mean_loss)
         │  per trial (trial_driver.py): the Tune function "driver" builds the trial's RunConfig
         │             (base + the trial's dotted keys; name <sweep>-<trial_id>, output_dir <sweep dir>/runs)
         │             and fits the TorchTrainer through run_pretrain, whose Ray Train callback
         │             forwards every checkpointed report with a finite metric to Tune
         ▼
    <sweep dir>/results.csv · best_config.yaml · sweep.yaml · runs/<sweep>-<trial_id>/ · Tune state

This is the documented Train V2 + Tune pattern (docs/design/ray.md §3): Tune schedules the drivers,
each driver's Train run reserves its own workers outside the trial, so Tune cannot see their
resources; ``max_concurrent_trials`` is therefore derived from the cluster's resources and each
trial's needs (``trial_resources.py``). A stopped or failed trial's driver takes its Train run and
its coordinator/influence/solver actors down with it (Ray's ownership); the next trial needs the
dashboard (``ray[default]``) to find the stopped run's placement group free (docs/design/ray.md §1).

Re-running a sweep with the same name and storage resumes it (``Tuner.restore``): finished trials
are kept, unfinished ones restart and their Train runs resume from their newest checkpoints.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from d3ray.config import RunConfig, absolute_paths
from d3ray.config_loading import ConfigError, from_dict, to_dict
from d3ray.tune.config import SweepConfig, is_uri
from d3ray.tune.results import (
    TrialRow,
    best_config_yaml,
    best_row,
    format_table,
    rank_rows,
    results_csv,
    trial_row,
)
from d3ray.tune.search_space import (
    Axis,
    parse_space,
    trial_dict,
    trial_run_config,
    tune_param_space,
    validate_space,
    varying_keys,
)
from d3ray.tune.trial_driver import TrialPlan, train_driver
from d3ray.tune.trial_resources import concurrent_trials

logger = logging.getLogger(__name__)


@dataclass
class SweepOutcome:
    """What :func:`run_sweep` returns."""

    sweep_dir: str
    rows: list[TrialRow]
    """Best first."""
    best: TrialRow | None
    max_concurrent_trials: int

    @property
    def finished(self) -> bool:
        """False when the sweep was interrupted (trials left to run: re-run it to resume)."""
        return not any(r.status == "unfinished" for r in self.rows)


def sweep_dir(sweep: SweepConfig) -> str:
    """``<storage_path>/<name>``: absolute for local paths, the URI otherwise."""
    if is_uri(sweep.storage_path):
        return sweep.storage_path.rstrip("/") + "/" + sweep.name
    return str(Path(sweep.storage_path.removeprefix("file://")).expanduser().resolve() / sweep.name)


def runs_dir(sweep: SweepConfig) -> str:
    """Absolute parent of the trials' run directories."""
    if sweep.runs_dir is not None:
        return str(Path(sweep.runs_dir).expanduser().resolve())
    return str(Path(sweep_dir(sweep)) / "runs")


def load_base(sweep: SweepConfig) -> dict[str, Any]:
    """The base RunConfig (file + defaults) as a plain dict, local paths made absolute."""
    from d3ray.config_loading import load_config

    base = absolute_paths(load_config(RunConfig, sweep.base_config))
    if base["data"]["tokenize_actors"] == 0:  # sized to the cluster: each trial would take the whole of it
        logger.info("sweep: trials share the cluster, so data.tokenize_actors=0 runs each trial with 1 tokenizer")
        base["data"]["tokenize_actors"] = 1
    return base


def _write_text(directory: str, name: str, text: str) -> str:
    """Write ``directory/name`` (a local path or a pyarrow-supported URI); its location."""
    if not is_uri(directory):
        path = Path(directory) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(text)
        tmp.replace(path)
        return str(path)
    import pyarrow.fs

    fs, root = pyarrow.fs.FileSystem.from_uri(directory)
    fs.create_dir(root, recursive=True)
    with fs.open_output_stream(f"{root}/{name}") as out:
        out.write(text.encode())
    return f"{directory}/{name}"


def _read_text(directory: str, name: str) -> str | None:
    if not is_uri(directory):
        path = Path(directory) / name
        return path.read_text() if path.exists() else None
    import pyarrow.fs

    fs, root = pyarrow.fs.FileSystem.from_uri(directory)
    if fs.get_file_info(f"{root}/{name}").type == pyarrow.fs.FileType.NotFound:
        return None
    with fs.open_input_stream(f"{root}/{name}") as fh:
        return fh.read().decode()


def _identity(sweep: SweepConfig, base: dict[str, Any]) -> dict[str, Any]:
    """What must not change when a sweep is resumed (the trials already run depend on it)."""
    keep = ("space", "metric", "mode", "num_samples", "search_seed", "scheduler")
    return {"sweep": {k: v for k, v in to_dict(sweep).items() if k in keep}, "base": base}


def prepare(sweep: SweepConfig) -> tuple[dict[str, Any], list[Axis], list[RunConfig]]:
    """Load the base config, parse the space and check every key against RunConfig (no Ray needed).

    Raises:
        ConfigError: an unknown or ill-typed key, naming it.
    """
    base = load_base(sweep)
    axes = parse_space(sweep.space)
    for axis in axes:
        if axis.key in ("name", "output_dir"):
            raise ConfigError(
                f"search space key {axis.key!r}: set per trial by the sweep; it cannot be swept"
            )
    configs = validate_space(base, axes)
    for cfg in configs:
        if cfg.train.eval_every == 0 and sweep.scheduler.type_name == "asha":
            logger.warning(
                "train.eval_every=0: the only validation is at the end, so ASHA cannot stop a trial early"
            )
            break
    return base, axes, configs


def run_sweep(sweep: SweepConfig, resume: bool | None = None) -> SweepOutcome:
    """Run (or resume) the sweep to completion; write and print the results table and best config.

    Args:
        sweep: the sweep.
        resume: True: restore the sweep (error if there is nothing to restore); False: start fresh
            (error if the sweep directory holds a sweep); None: restore if there is one, else start.

    Raises:
        ConfigError: bad keys in the space, or a resumed sweep whose space/base config changed.
    """
    import ray

    from d3ray.run.cluster import start_ray, worker_env

    base, axes, configs = prepare(sweep)
    directory = sweep_dir(sweep)
    identity = json.loads(json.dumps(_identity(sweep, base)))  # plain lists/dicts, as sweep.yaml holds them
    restoring = _should_restore(sweep, directory, identity, resume)
    constants = {a.key: a.values[0] for a in axes if not a.varies}  # into the base: Tune sees what varies
    plan = TrialPlan(
        base=trial_dict(base, constants), sweep_name=sweep.name, runs_dir=runs_dir(sweep), metric=sweep.metric
    )

    owns_ray = start_ray(sweep.ray, worker_env(from_dict(RunConfig, base)))
    try:
        cluster = {k: v for k, v in ray.cluster_resources().items() if not k.startswith("node:")}
        derived, per_trial = concurrent_trials(cluster, configs, sweep.driver_cpus)
        concurrent = sweep.max_concurrent_trials or derived
        logger.info(
            "sweep %s: per trial %s, cluster %s → max_concurrent_trials=%d%s",
            sweep.name,
            per_trial,
            cluster,
            concurrent,
            " (set in the config)" if sweep.max_concurrent_trials else "",
        )
        _write_text(directory, "sweep.yaml", yaml.safe_dump(identity, sort_keys=False))
        grid = _tuner(sweep, axes, configs, plan, directory, concurrent, restoring).fit()
        # Tune's Trial objects, in the order of the results, are the only record of a trial's status
        # (a private attribute of ResultGrid; Ray is pinned to 2.60)
        trials = grid._experiment_analysis.trials
        rows = [
            _row(result, trial, axes, plan, sweep.metric) for result, trial in zip(grid, trials, strict=True)
        ]
    finally:
        if owns_ray:
            ray.shutdown()
    return write_outputs(sweep, directory, rows, varying_keys(axes), concurrent)


def _should_restore(
    sweep: SweepConfig, directory: str, identity: dict[str, Any], resume: bool | None
) -> bool:
    """Whether to restore the sweep in ``directory`` (see :func:`run_sweep`'s ``resume``)."""
    from ray import tune

    saved = _read_text(directory, "sweep.yaml")
    restorable = saved is not None and tune.Tuner.can_restore(directory)
    if resume is True and not restorable:
        raise ConfigError(f"--resume: no sweep to resume in {directory}")
    if resume is False and restorable:
        raise ConfigError(f"a sweep named {sweep.name!r} exists in {directory}; resume it or pick a new name")
    if restorable and resume is not False and yaml.safe_load(saved) != identity:
        raise ConfigError(
            f"sweep {sweep.name!r} in {directory} was started with a different search space, base config, "
            "metric or scheduler (see its sweep.yaml); use its original config, or a new name"
        )
    return restorable and resume is not False


def _tuner(
    sweep: SweepConfig,
    axes: list[Axis],
    configs: list[RunConfig],
    plan: TrialPlan,
    directory: str,
    concurrent: int,
    restoring: bool,
) -> Any:
    """A new Tuner over the varying axes, or the one restored from ``directory``."""
    from ray import tune
    from ray.tune.search import BasicVariantGenerator

    trainable = tune.with_resources(tune.with_parameters(train_driver, plan=plan), {"CPU": sweep.driver_cpus})
    if restoring:
        logger.info("resuming sweep %s from %s", sweep.name, directory)
        return tune.Tuner.restore(directory, trainable, resume_unfinished=True, resume_errored=False)
    return tune.Tuner(
        trainable,
        param_space=tune_param_space([a for a in axes if a.varies]),
        tune_config=tune.TuneConfig(
            metric=sweep.metric,
            mode=sweep.mode,
            num_samples=sweep.num_samples,
            # the concurrency limit goes to the generator: Tune ignores TuneConfig's when given one
            search_alg=BasicVariantGenerator(max_concurrent=concurrent, random_state=sweep.search_seed),
            scheduler=sweep.scheduler.build(max(cfg.train.steps for cfg in configs)),
            trial_dirname_creator=trial_dirname,
        ),
        run_config=tune.RunConfig(
            name=sweep.name,
            storage_path=directory.rsplit("/", 1)[0],
            failure_config=tune.FailureConfig(max_failures=sweep.trial_max_failures),
        ),
    )


def trial_dirname(trial: Any) -> str:
    """Tune's directory of a trial: ``trial_<trial id>`` (its run directory is ``runs/<sweep>-<trial id>``)."""
    return f"trial_{trial.trial_id}"


def _row(result: Any, trial: Any, axes: list[Axis], plan: TrialPlan, metric: str) -> TrialRow:
    """A results-table row from a Tune ``Result`` and its ``Trial``."""
    params = {a.key: result.config.get(a.key) for a in axes if a.varies}
    cfg = trial_run_config(
        plan.base, result.config, name=f"{plan.sweep_name}-{trial.trial_id}", output_dir=plan.runs_dir
    )
    return trial_row(trial.trial_id, params, cfg, result.metrics, result.error, metric, trial.status)


def write_outputs(
    sweep: SweepConfig, directory: str, rows: list[TrialRow], keys: list[str], concurrent: int
) -> SweepOutcome:
    """Write results.csv and best_config.yaml into the sweep directory; print the table."""
    ranked = rank_rows(rows, sweep.mode)
    where = _write_text(directory, "results.csv", results_csv(ranked, keys, sweep.metric))
    best = best_row(ranked, sweep.mode)
    failed, unfinished = (sum(r.status == s for r in rows) for s in ("error", "unfinished"))
    print(
        f"\nsweep {sweep.name}: {len(rows)} trials ({failed} failed, {unfinished} unfinished), results in {where}"
    )
    print(format_table(ranked, keys, sweep.metric))
    if unfinished:
        logger.warning("sweep %s was interrupted: run the same command again to resume it", sweep.name)
    if best is None:
        logger.warning("no trial reported a finite %s: no best config written", sweep.metric)
    else:
        where = _write_text(directory, "best_config.yaml", best_config_yaml(best, sweep.name, sweep.metric))
        print(f"best: {best.trial_id} {sweep.metric}={best.metric:.4f} → {where}")
    return SweepOutcome(directory, ranked, best, concurrent)
