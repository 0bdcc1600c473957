"""Running the grid: every arm × seed through ``run_pretrain``, resumable, failures recorded.

    plan (plan.py) ──► finished?  <run_dir>/final_metrics.json exists  → skipped (read back)
                   ──► config error                                   → failed, not started
                   ──► the rest, in plan order:
                         max_concurrent_runs = 1   one after another in this process (one Ray instance)
                         max_concurrent_runs = N   Ray tasks (one per run, ``driver_cpus`` each, a fresh
                                                   worker process per run), at most N in flight (fewer,
                                                   said, where fewer runs fit the cluster: run_limit)
                         max_concurrent_runs = 0   N from the cluster and each run's needs (tune.trial_resources)
    each run: run_pretrain(cfg) → done | failed (error + traceback in <run_dir>/compare_error.txt);
              <run_dir>/compare_status.json records the outcome either way

Why Ray tasks and not Tune trials (``d3ray sweep``): a comparison is a fixed grid with no early
stopping (ASHA would break equal tokens), its runs are named ``<arm>-s<seed>`` so that a rerun
finds them by name, and adding an arm or a seed to the config must reuse the finished runs; Tune
identifies trials by ids and refuses to restore a changed search space. What fits is reused:
``trial_resources`` and ``derive_max_concurrent_trials`` size the concurrency, and each run resumes
from its own newest checkpoint exactly as a trial does (``run_pretrain``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from d3ray.config import RunConfig
from d3ray.lab.compare.plan import ComparePlan, RunSpec
from d3ray.run_files import FINAL_METRICS, is_finished

logger = logging.getLogger(__name__)

STATUS = "compare_status.json"
ERROR = "compare_error.txt"


@dataclass
class RunOutcome:
    """What became of one run of the grid."""

    spec: RunSpec
    status: str
    """``done`` (ran now), ``skipped`` (finished before: read back), ``failed``."""
    final: dict[str, Any] = field(default_factory=dict)
    """Its final metrics (final_metrics.json)."""
    error: str | None = None
    seconds: float | None = None
    """Wall seconds of this attempt (None when skipped or not started)."""

    @property
    def ok(self) -> bool:
        return self.status in ("done", "skipped")


def run_grid(plan: ComparePlan) -> list[RunOutcome]:
    """Run every unfinished run of ``plan``; the outcome of every run, in plan order."""
    outcomes: dict[str, RunOutcome] = {}
    todo: list[RunSpec] = []
    for spec in plan.runs:
        if spec.config is None:
            outcomes[spec.name] = RunOutcome(spec, "failed", error=spec.error)
        elif is_finished(spec.run_dir):
            check_unchanged(spec, plan.compare.init_from is not None)
            outcomes[spec.name] = RunOutcome(spec, "skipped", final=read_final(spec.run_dir))
        else:
            todo.append(spec)
    skipped = sum(o.status == "skipped" for o in outcomes.values())
    print(f"compare {plan.compare.name}: {len(plan.runs)} runs, {skipped} finished before, {len(todo)} to run, "
          f"{sum(o.status == 'failed' for o in outcomes.values())} that cannot be built", flush=True)
    if todo:
        ensure_shared_tokenizer(plan)
        for outcome in _execute(plan, todo):
            outcomes[outcome.spec.name] = outcome
    return [outcomes[spec.name] for spec in plan.runs]


#: Keys a finished run may differ in from its planned config: how Ray was reached, and the start
#: point ``start_from`` writes into the run's config (``init_from``).
UNCOMPARED = ("ray", "storage_path")
UNCOMPARED_INIT = ("model.pretrained_path", "data.tokenizer.path")


def check_unchanged(spec: RunSpec, init_from: bool = False) -> None:
    """Refuse to reuse a finished run whose config.yaml differs from the planned config (an edited
    comparison file would otherwise mix runs of different token budgets or settings). A key the saved
    config does not have at all (the run predates it) is read as today's default, and printed as such
    (the comparison ``run_pretrain`` makes too: ``d3ray.run.rerun.stored_config_changes``).

    Raises:
        ConfigError: naming the run and the differing keys.
    """
    import yaml

    from d3ray.config_loading import ConfigError
    from d3ray.run.rerun import stored_config_changes

    path = spec.run_dir / "config.yaml"
    if spec.config is None or not path.is_file():
        return
    ignored = UNCOMPARED + (UNCOMPARED_INIT if init_from else ())
    changes, predating = stored_config_changes(yaml.safe_load(path.read_text()) or {}, spec.config, ignored)
    if changes:
        raise ConfigError(
            f"run {spec.name} in {spec.run_dir} finished with another config "
            f"({', '.join(key for key, _, _ in changes[:6])} differ): delete that run directory to rerun it, "
            "or use another output_dir")
    if predating:
        print(f"compare: run {spec.name}'s config.yaml predates {', '.join(predating[:6])}"
              f"{' ...' if len(predating) > 6 else ''}; read as today's defaults", flush=True)


def outcomes_on_disk(plan: ComparePlan) -> list[RunOutcome]:
    """The outcome of every run as its directory shows it, running nothing (``--report-only``)."""
    out = []
    for spec in plan.runs:
        if spec.config is None:
            out.append(RunOutcome(spec, "failed", error=spec.error))
        elif is_finished(spec.run_dir):
            out.append(RunOutcome(spec, "skipped", final=read_final(spec.run_dir)))
        else:
            status = spec.run_dir / STATUS
            error = json.loads(status.read_text()).get("error") if status.is_file() else None
            out.append(RunOutcome(spec, "failed", error=error or "not run yet"))
    return out


def ensure_shared_tokenizer(plan: ComparePlan) -> None:
    """Train ``<output_dir>/tokenizer`` once (pre-training on files), before any run starts."""
    if plan.shared_tokenizer is None or (plan.shared_tokenizer / "tokenizer.json").is_file():
        return
    from d3ray.data.shards import list_shards
    from d3ray.data.tokenizer import ensure_tokenizer

    data = plan.base.data
    data = dataclasses.replace(data, tokenizer=dataclasses.replace(data.tokenizer, path=None))
    made = ensure_tokenizer(data, list_shards(data.train_paths), plan.shared_tokenizer.parent)
    assert Path(made) == plan.shared_tokenizer, (made, plan.shared_tokenizer)


def _execute(plan: ComparePlan, todo: list[RunSpec]) -> list[RunOutcome]:
    import ray

    from d3ray.run.cluster import start_ray, worker_env

    owns_ray = start_ray(plan.compare.ray, worker_env(plan.base))
    try:
        limit = run_limit(plan, todo, local=owns_ray and plan.compare.ray.address in (None, "local"))

        def run(specs: list[RunSpec]) -> list[RunOutcome]:
            if not specs:
                return []
            return [_run_here(plan, spec) for spec in specs] if limit == 1 else _run_as_tasks(plan, specs, limit)

        todo, failed = _branch_from_trunks(plan, todo, run)
        return failed + run(todo)
    finally:
        if owns_ray:
            ray.shutdown()


def _branch_from_trunks(plan: ComparePlan, todo: list[RunSpec], run: Any) -> tuple[list[RunSpec], list[RunOutcome]]:
    """With a trunk: train the unfinished trunks of the seeds in ``todo`` (``run``), then give every run
    its branch checkpoint (``trunk.branch_checkpoint``). Returns the runs ready to start and the
    outcomes of those that cannot (their trunk failed)."""
    if not plan.trunks:
        return todo, []
    from d3ray.lab.compare.trunk import BRANCH_DIR, branch_checkpoint

    trunks = [plan.trunks[seed] for seed in sorted({spec.seed for spec in todo})]
    pending = [t for t in trunks if not is_finished(t.run_dir)]
    print(f"compare: {len(trunks)} trunks of {plan.trunk_steps} steps, {len(pending)} to train", flush=True)
    trunk_errors = {o.spec.seed: o.error for o in run(pending) if not o.ok}
    ready, failed = [], []
    for spec in todo:
        assert spec.config is not None
        error = trunk_errors.get(spec.seed)
        if error is None:
            try:
                branch_checkpoint(plan.trunks[spec.seed].run_dir, plan.trunk_steps, spec.run_dir / BRANCH_DIR,
                                  plan.same_stream.get(spec.arm, False), spec.config.schedule.L)
            except (ValueError, OSError) as err:  # ConfigError is a ValueError: no trunk checkpoint at N
                error = _describe(err)
        else:
            error = f"its trunk trunk-s{spec.seed} failed: {error}"
        if error is None:
            ready.append(spec)
        else:
            outcome = RunOutcome(spec, "failed", error=error)
            _record(outcome)
            failed.append(outcome)
    return ready, failed


def run_limit(plan: ComparePlan, todo: list[RunSpec], local: bool = True) -> int:
    """Runs at once: 1 as asked; else what fits the cluster (``max_concurrent_runs: 0``), or the N asked for.
    On a local Ray instance this process started (``local``) more than fit would each start their trainers
    and actors and wait on each other's CPUs until Ray Train's start-up timeout (runs of actor arms stalled
    so on a 2-core box): N is lowered to what fits, said in one line. On a cluster N is taken as given (an
    autoscaler may add the nodes)."""
    asked = plan.compare.max_concurrent_runs
    if asked == 1:
        return 1
    fits, per_run, cluster = derive_concurrency(plan, todo)
    if asked and (asked <= fits or not local):
        return asked
    if asked:
        print(f"compare: max_concurrent_runs={asked}, but {fits} run(s) fit this cluster at once (a run needs "
              f"{per_run} with its driver; the cluster has {cluster}): running {fits} at a time", flush=True)
    return fits


def derive_concurrency(plan: ComparePlan, todo: list[RunSpec]) -> tuple[int, dict, dict]:
    """(runs that fit the cluster at once, the most a run needs of each resource, the cluster's resources),
    as ``d3ray sweep`` sizes trials."""
    import ray

    from d3ray.tune.trial_resources import concurrent_trials

    cluster = {k: v for k, v in ray.cluster_resources().items() if not k.startswith("node:")}
    limit, per_run = concurrent_trials(cluster, [spec.config for spec in todo if spec.config is not None],
                                       plan.compare.driver_cpus)
    logger.info("compare: per run %s, cluster %s → %d runs at once", per_run, cluster, limit)
    return limit, per_run, cluster


def execute_run(cfg: RunConfig, init_from: str | None = None) -> dict[str, Any]:
    """One run of the grid (in this process or a Ray task): ``run_pretrain``, from ``init_from`` if set."""
    from d3ray.run.pretrain import run_pretrain

    if init_from is not None:
        from d3ray.export.start import start_from

        cfg = start_from(cfg, Path(init_from))
    return run_pretrain(cfg)


def _run_here(plan: ComparePlan, spec: RunSpec) -> RunOutcome:
    """Run ``spec`` in this process; an exception fails the run, not the grid."""
    assert spec.config is not None
    root = logging.getLogger()
    handlers = list(root.handlers)
    started = time.perf_counter()
    try:
        final = execute_run(spec.config, plan.compare.init_from)
        outcome = RunOutcome(spec, "done", final=final)
    except Exception as err:  # the grid goes on: the error is the run's result, recorded in full below
        outcome = RunOutcome(spec, "failed", error=_describe(err))
        _write_traceback(spec.run_dir, traceback.format_exc())
    finally:
        for handler in root.handlers[:]:  # run_pretrain logs this process into the run's logs/driver.log
            if handler not in handlers:
                root.removeHandler(handler)
                handler.close()
    outcome.seconds = time.perf_counter() - started
    _record(outcome)
    return outcome


def _run_as_tasks(plan: ComparePlan, todo: list[RunSpec], limit: int) -> list[RunOutcome]:
    """Up to ``limit`` runs at once, each a Ray task in a fresh worker process (``max_calls=1``)."""
    import ray

    task = ray.remote(num_cpus=plan.compare.driver_cpus, max_retries=0, max_calls=1)(execute_run)
    queue = list(todo)
    pending: dict[Any, tuple[RunSpec, float]] = {}
    outcomes = []
    print(f"compare: up to {limit} runs at once (Ray tasks)", flush=True)
    while queue or pending:
        while queue and len(pending) < limit:
            spec = queue.pop(0)
            pending[task.remote(spec.config, plan.compare.init_from)] = (spec, time.perf_counter())
        done, _ = ray.wait(list(pending), num_returns=1)
        for ref in done:
            spec, started = pending.pop(ref)
            try:
                outcome = RunOutcome(spec, "done", final=ray.get(ref))
            except ray.exceptions.RayTaskError as err:  # the task's exception, raised here: the run failed
                cause = err.cause if isinstance(getattr(err, "cause", None), BaseException) else err
                outcome = RunOutcome(spec, "failed", error=_describe(cause))
                _write_traceback(spec.run_dir, str(err))
            except ray.exceptions.RayError as err:  # the worker died (OOM, node lost)
                outcome = RunOutcome(spec, "failed", error=_describe(err))
                _write_traceback(spec.run_dir, str(err))
            outcome.seconds = time.perf_counter() - started
            _record(outcome)
            outcomes.append(outcome)
    return outcomes


def _describe(err: BaseException) -> str:
    """``Type: first lines of the message`` (at most 500 characters)."""
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text}"[:500]


def _write_traceback(run_dir: Path, text: str) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / ERROR).write_text(text)


def _record(outcome: RunOutcome) -> None:
    """``<run_dir>/compare_status.json``: status, error, seconds, when; and print one line."""
    run_dir = outcome.spec.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / STATUS).write_text(json.dumps({
        "status": outcome.status, "error": outcome.error, "seconds": outcome.seconds,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S")}, indent=2))
    if outcome.ok and (run_dir / ERROR).exists():
        (run_dir / ERROR).unlink()
    what = f"failed: {outcome.error}" if not outcome.ok else f"done in {outcome.seconds:.0f}s"
    print(f"compare: {outcome.spec.name} {what}", flush=True)


def read_final(run_dir: Path) -> dict[str, Any]:
    """The run's final metrics ({} when it has none)."""
    path = run_dir / FINAL_METRICS
    return json.loads(path.read_text()) if path.is_file() else {}
