"""RegMix: fit a regression from mixture to validation loss on small proxy runs, train on its best mixture.

Liu, Zeng, Dou, Huang, Li, Chen, Pang, Lin & Lin 2024, "RegMix: Data Mixture as Regression for
Language Model Pre-training" (arXiv 2407.01492), section 2:

    1. N proxy runs, each a short training run on a random mixture x_n ~ Dirichlet (the paper: 512 runs
       of 1M-parameter models on 1B tokens; mixtures from a Dirichlet around the token distribution);
    2. a regression f(x) ≈ target validation loss fitted on the N pairs (x_n, y_n) (the paper: LightGBM,
       and a linear model as the baseline);
    3. simulate many mixtures (the paper: 1M), predict their loss, average the top-k predicted mixtures
       (the paper: k = 100) and train the main model on that mixture, static.

Here: proxies are ``run_pretrain`` runs of ``proxy_steps`` steps with a ``static`` mixture (the run's own
model unless ``proxy_overrides`` shrinks it), launched as Ray tasks, ``proxy_parallel`` at a time (1 on a
small box: sequential); the target is the proxy's final ``eval/mean_loss`` (``target: mean``) or one held-out
set's loss (``eval/<name>/loss``). ``regressor: ridge`` (default) is ridge regression on the mixture and its
pairwise products (a quadratic surface: unlike the paper's linear baseline it has interior optima, and it
fits with the few proxies a small box affords); ``regressor: lightgbm`` is the paper's LightGBM (needs many
proxies: a tree ensemble is piecewise constant). Fit quality: K-fold held-out R² and Spearman ρ of the
predictions. Proxy mixtures and the search draw from Dirichlet(concentration · 1) (the paper centres its
Dirichlet on the token distribution; here the mixed domains are weighted alike).

Everything lands in ``<run_dir>/regmix/``: ``proxies.csv`` (mixture, target, proxy run dir),
``fit.json`` (regressor, held-out R² and Spearman, the chosen mixture and its predicted loss),
``mixture.json`` (the mixture of the main run). A resumed run reads ``mixture.json`` and runs nothing again;
proxies that finished (``final_metrics.json``) are not run again either.
"""

from __future__ import annotations

import csv
import json
import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from d3ray.run_files import FINAL_METRICS

logger = logging.getLogger(__name__)

_PROXY_KEY, _SEARCH_KEY, _FOLD_KEY = 0x70726F78, 0x73656172, 0x666F6C64


def sample_mixtures(n: int, k: int, concentration: float, seed: int, key: int = _PROXY_KEY) -> np.ndarray:
    """(n, k) mixtures ~ Dirichlet(concentration · 1_k), seeded."""
    rng = np.random.default_rng([seed, key])
    x = rng.dirichlet(np.full(k, float(concentration)), size=n)
    return x / x.sum(axis=1, keepdims=True)


def quadratic_features(x: np.ndarray) -> np.ndarray:
    """[x_i, x_i·x_j (i ≤ j)] of (n, k) mixtures: (n, k + k(k+1)/2)."""
    x = np.asarray(x, dtype=np.float64)
    i, j = np.triu_indices(x.shape[1])
    return np.concatenate([x, x[:, i] * x[:, j]], axis=1)


class RidgeRegressor:
    """Ridge regression on :func:`quadratic_features` with an unpenalised intercept (closed form)."""

    def __init__(self, alpha: float = 1e-4) -> None:
        self.alpha = alpha

    def fit(self, x: np.ndarray, y: np.ndarray) -> RidgeRegressor:
        f = quadratic_features(x)
        self._mean, self._y = f.mean(axis=0), float(np.mean(y))
        fc = f - self._mean
        self._coef = np.linalg.solve(fc.T @ fc + self.alpha * np.eye(fc.shape[1]), fc.T @ (np.asarray(y) - self._y))
        return self

    def predict(self, x: np.ndarray) -> np.ndarray:
        return (quadratic_features(x) - self._mean) @ self._coef + self._y


class LightGbmRegressor:
    """The paper's regressor (LightGBM, gradient-boosted trees), with small-sample leaf sizes."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def fit(self, x: np.ndarray, y: np.ndarray) -> LightGbmRegressor:
        import lightgbm

        self._model = lightgbm.LGBMRegressor(n_estimators=300, learning_rate=0.03, num_leaves=15, n_jobs=1,
                                             min_child_samples=max(2, min(20, len(y) // 10)), subsample=1.0,
                                             random_state=self.seed, verbose=-1)
        self._model.fit(np.asarray(x), np.asarray(y))
        return self

    def predict(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(self._model.predict(np.asarray(x)), dtype=np.float64)


def make_regressor(kind: str, seed: int, ridge_alpha: float = 1e-4) -> Any:
    if kind == "ridge":
        return RidgeRegressor(ridge_alpha)
    if kind == "lightgbm":
        return LightGbmRegressor(seed)
    raise ValueError(f"schedule.regressor={kind!r} must be 'ridge' or 'lightgbm'")


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's ρ (average ranks for ties)."""
    from scipy.stats import spearmanr

    rho = spearmanr(a, b).statistic
    return float(rho) if np.isfinite(rho) else float("nan")


def held_out_quality(x: np.ndarray, y: np.ndarray, kind: str, seed: int, folds: int = 5,
                     ridge_alpha: float = 1e-4) -> dict[str, float]:
    """K-fold held-out predictions of the regressor: R² and Spearman ρ against the targets."""
    n = len(y)
    folds = max(2, min(folds, n))
    perm = np.random.default_rng([seed, _FOLD_KEY]).permutation(n)
    pred = np.empty(n)
    for f in range(folds):
        test = perm[f::folds]
        train = np.setdiff1d(perm, test)
        pred[test] = make_regressor(kind, seed, ridge_alpha).fit(x[train], y[train]).predict(x[test])
    ss_res = float(np.sum((y - pred) ** 2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    return {"held_out_r2": 1.0 - ss_res / ss_tot if ss_tot > 0 else float("nan"),
            "held_out_spearman": spearman(pred, y), "folds": folds}


def best_mixture(model: Any, k: int, search: int, top_k: int, concentration: float, seed: int) -> tuple[np.ndarray, float]:
    """The mean of the ``top_k`` of ``search`` sampled mixtures with the lowest predicted loss, and the
    predicted loss of that mean (RegMix's simulate-and-average)."""
    x = sample_mixtures(search, k, concentration, seed, _SEARCH_KEY)
    pred = model.predict(x)
    top = np.argsort(pred, kind="stable")[: max(1, min(top_k, search))]
    mix = x[top].mean(axis=0)
    mix = mix / mix.sum()
    return mix, float(model.predict(mix[None])[0])


def fit_and_choose(table: list[dict[str, Any]], domains: list[str], kind: str, search: int, top_k: int,
                   concentration: float, seed: int, ridge_alpha: float = 1e-4) -> dict[str, Any]:
    """Fit the regression on the proxy table and choose the mixture (``fit.json``'s content)."""
    x = np.asarray([[float(r["mixture"].get(d, 0.0)) for d in domains] for r in table], dtype=np.float64)
    y = np.asarray([float(r["target"]) for r in table], dtype=np.float64)
    ok = np.isfinite(y)
    if ok.sum() < 3:
        raise ValueError(f"regmix: {int(ok.sum())} proxy runs with a finite target; the regression needs >= 3")
    x, y = x[ok], y[ok]
    model = make_regressor(kind, seed, ridge_alpha).fit(x, y)
    mix, predicted = best_mixture(model, len(domains), search, top_k, concentration, seed)
    return {"regressor": kind, "proxies": int(len(y)), **held_out_quality(x, y, kind, seed, ridge_alpha=ridge_alpha),
            "train_r2": float(1 - np.sum((y - model.predict(x)) ** 2) / max(np.sum((y - y.mean()) ** 2), 1e-300)),
            "best_proxy_target": float(y.min()),
            "mixture": {d: float(w) for d, w in zip(domains, mix, strict=True)}, "predicted_target": predicted}


# ---- files -------------------------------------------------------------------------------------------
def read_proxy_table(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a ``proxies.csv``: ``{"mixture": {domain: w}, "target": y}`` (columns ``mix/<domain>``, ``target``)."""
    rows = []
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            mixture = {k[len("mix/"):]: float(v) for k, v in row.items() if k.startswith("mix/")}
            target = float(row["target"]) if row.get("target") not in (None, "") else math.nan
            rows.append({"mixture": mixture, "target": target, "run_dir": row.get("run_dir", "")})
    if not rows:
        raise ValueError(f"schedule.proxy_table={path}: no rows")
    return rows


def write_proxy_table(path: Path, table: list[dict[str, Any]], domains: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["proxy", *[f"mix/{d}" for d in domains], "target", "run_dir"])
        writer.writeheader()
        for i, r in enumerate(table):
            writer.writerow({"proxy": i, **{f"mix/{d}": r["mixture"].get(d, 0.0) for d in domains},
                             "target": r["target"], "run_dir": r.get("run_dir", "")})


def regmix_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "regmix"


def chosen_mixture(run_dir: str | Path) -> dict[str, float] | None:
    """The main run's mixture if it was chosen already (``regmix/mixture.json``)."""
    path = regmix_dir(run_dir) / "mixture.json"
    return json.loads(path.read_text()) if path.exists() else None


def choose_from_table(cfg: Any, table: list[dict[str, Any]], domains: list[str], seed: int, run_dir: str | Path) -> dict:
    """Fit, choose and write ``proxies.csv``, ``fit.json``, ``mixture.json``; the chosen mixture."""
    out = regmix_dir(run_dir)
    write_proxy_table(out / "proxies.csv", table, domains)
    fit = fit_and_choose(table, domains, cfg.regressor, cfg.search_samples, cfg.top_k, cfg.concentration, seed,
                         cfg.ridge_alpha)
    (out / "fit.json").write_text(json.dumps(fit, indent=2))
    (out / "mixture.json").write_text(json.dumps(fit["mixture"], indent=2))
    logger.info("regmix: %d proxies, held-out R² %.3f, Spearman %.3f; mixture %s (predicted %s %.4f)",
                fit["proxies"], fit["held_out_r2"], fit["held_out_spearman"], fit["mixture"], cfg.target,
                fit["predicted_target"])
    print(f"regmix: {fit['proxies']} proxies, held-out R² {fit['held_out_r2']:.3f}, Spearman "
          f"{fit['held_out_spearman']:.3f}; main-run mixture "
          + ", ".join(f"{d} {w:.3f}" for d, w in fit["mixture"].items()), flush=True)
    return fit["mixture"]


def proxy_target(final: dict[str, Any], target: str) -> float:
    """The proxy's target value from its final metrics (``eval/mean_loss`` or ``eval/<target>/loss``)."""
    key = "eval/mean_loss" if target == "mean" else f"eval/{target}/loss"
    if key not in final:
        known = sorted(k for k in final if k.startswith("eval/") and k.endswith("loss"))
        raise ValueError(f"schedule.target={target!r}: the proxy runs report no {key} (they report {known}); "
                         f"RegMix needs held-out sets (data.validation_paths)")
    return float(final[key])


def run_proxies(proxy_cfgs: list[Any], run: Callable[[Any], dict[str, Any]], parallel: int, num_cpus: float,
                target: str) -> list[float]:
    """Run the proxy configs as Ray tasks, ``parallel`` at a time (each task calls ``run(cfg)``, the
    driver's ``run_pretrain``); the target value of each. Finished proxies are read, not run again."""
    import ray

    results: dict[int, float] = {}
    todo = []
    for i, pcfg in enumerate(proxy_cfgs):
        done = Path(pcfg.run_dir) / FINAL_METRICS
        if done.exists():
            results[i] = proxy_target(json.loads(done.read_text()), target)
        else:
            todo.append(i)
    task = ray.remote(num_cpus=num_cpus, max_retries=0)(run)
    running: dict[Any, int] = {}
    while todo or running:
        while todo and len(running) < parallel:
            i = todo.pop(0)
            print(f"regmix: proxy {i + 1}/{len(proxy_cfgs)} ({Path(proxy_cfgs[i].run_dir).name})", flush=True)
            running[task.remote(proxy_cfgs[i])] = i
        ready, _ = ray.wait(list(running), num_returns=1)
        for ref in ready:
            i = running.pop(ref)
            results[i] = proxy_target(ray.get(ref), target)
    return [results[i] for i in range(len(proxy_cfgs))]
