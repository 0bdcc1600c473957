"""``d3ray solve``: order any weighted linear ordering problem from a matrix file.

    d3ray solve MATRIX_FILE [--solver NAME] [--time-budget S] [--seed N]

MATRIX_FILE is plain text (first token n, then n rows of n numbers; c[i][j] is the weight collected
when i comes before j; the diagonal is ignored) or a ``.npy`` square array with the same meaning.
The solver orders S = C − Cᵀ (minimising the violated weight of S is maximising the forward weight
of C) and prints one JSON object: ``order`` (0-based), ``forward_weight`` (Σ_{i before j} c[i][j]),
``backward_weight``, ``seconds``, plus ``solver``, ``n`` and ``initial_forward_weight`` (identity order).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import numpy as np

from d3ray.errors import UserError
from d3ray.solver.base import DEFAULT_SOLVER, SolverConfig, override

logger = logging.getLogger(__name__)

__all__ = ["read_weight_matrix", "forward_backward_weight", "register"]


def read_weight_matrix(path: str | Path) -> np.ndarray:
    """Read a square weight matrix C from ``.npy`` or the plain text format above.

    Returns:
        (n, n) float64 array.

    Raises:
        ValueError: malformed file (wrong count of numbers, a non-number, not square); the message
            names the file.
    """
    path = Path(path)
    if path.suffix == ".npy":
        C = np.load(path, allow_pickle=False)
    else:
        tokens = path.read_text().split()
        if not tokens:
            raise ValueError(f"{path}: empty file; expected n followed by n rows of n numbers")
        try:
            n = int(tokens[0])
        except ValueError:
            raise ValueError(f"{path}: the first token must be the size n, got {tokens[0]!r}") from None
        if n < 0 or len(tokens) - 1 != n * n:
            raise ValueError(f"{path}: n = {n} needs {n * n} numbers after it, found {len(tokens) - 1}")
        try:
            C = np.array([float(t) for t in tokens[1:]], dtype=np.float64).reshape(n, n)
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from None
    C = np.asarray(C, dtype=np.float64)
    if C.ndim != 2 or C.shape[0] != C.shape[1]:
        raise ValueError(f"{path}: expected a square matrix, got shape {C.shape}")
    return C


def forward_backward_weight(C: np.ndarray, order: np.ndarray) -> tuple[float, float]:
    """(Σ_{i before j} c[i][j], Σ_{i after j} c[i][j]) of ``order``, diagonal excluded.

    Args:
        C: (n, n) weights, c[i][j] collected when i comes before j.
        order: (n,) permutation.
    """
    P = C[np.ix_(order, order)]  # (n, n) position space
    return float(np.triu(P, 1).sum()), float(np.tril(P, -1).sum())


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``d3ray solve`` to the top-level parser (the solvers register when d3ray.solver is imported)."""
    parser = subparsers.add_parser(
        "solve",
        help="order the items of a square weight matrix (any linear ordering problem)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "matrix_file", metavar="MATRIX_FILE", help="text (n, then n rows of n) or .npy matrix"
    )
    parser.add_argument(
        "--solver", default=DEFAULT_SOLVER, choices=SolverConfig.known(), help=f"default {DEFAULT_SOLVER}"
    )
    parser.add_argument(
        "--time-budget", type=float, default=None, metavar="S", help="wall-clock cap, seconds"
    )
    parser.add_argument("--seed", type=int, default=0, metavar="N", help="random seed (default 0)")
    parser.set_defaults(func=handle_solve)


def handle_solve(args: argparse.Namespace) -> int:
    """Solve the file's problem and print the JSON result on stdout."""
    try:
        config_cls = SolverConfig.lookup(args.solver)
        C = read_weight_matrix(args.matrix_file)
    except (OSError, ValueError) as err:
        raise UserError(str(err)) from err
    config = config_cls()
    if args.time_budget is not None:
        if not hasattr(config, "time_budget_s"):
            logger.warning("solver %s has no time budget; --time-budget ignored", args.solver)
        else:
            try:
                config = override(config, time_budget_s=args.time_budget)
            except ValueError as err:
                raise UserError(str(err)) from err
    C0 = C.copy()
    np.fill_diagonal(C0, 0.0)
    try:
        result = config.build().solve(C0 - C0.T, seed=args.seed)
    except ValueError as err:  # e.g. exact on n > 20, or a NaN in the file
        raise UserError(f"{args.matrix_file}: {err}") from err
    forward, backward = forward_backward_weight(C0, result.order)
    initial_forward, _ = forward_backward_weight(C0, np.arange(C0.shape[0]))
    out = {
        "order": result.order.tolist(),
        "forward_weight": forward,
        "backward_weight": backward,
        "seconds": result.seconds,
        "solver": args.solver,
        "n": int(C0.shape[0]),
        "initial_forward_weight": initial_forward,
    }
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")
    return 0
