"""Rewrite ``influence_before_registry.npz`` with the influence code from before the estimator registry.

The golden of ``tests/unit/test_influence_preconditioner.py::test_plain_step_reproduces_the_numbers_from_
before_the_registry`` holds S and A of every estimator, computed by the code at commit 54e2363, which
the current code must reproduce bit for bit. Bit for bit holds within one install: a new release of
transformers, numpy or torch may sum in another order (2026-12-02: up to 8.9e-16 on the look-ahead A,
for the old and the new code alike). Then rewrite the golden with the old code on the new install
(keeping its weights and batches) and the test checks the refactor again::

    git worktree add /tmp/before-registry 54e2363
    python tests/unit/data/write_influence_before_registry.py /tmp/before-registry
    git worktree remove /tmp/before-registry
"""

from __future__ import annotations

import sys
from pathlib import Path

GOLDEN = Path(__file__).with_name("influence_before_registry.npz")


def main(old_tree: str) -> None:
    import numpy as np
    import torch
    import transformers

    torch.set_num_threads(1)  # as tests/conftest.py runs every test
    sys.path.insert(0, old_tree)
    import d3ray

    if not d3ray.__file__.startswith(str(Path(old_tree).resolve())):
        raise SystemExit(f"d3ray imports from {d3ray.__file__}, not from {old_tree}")
    from d3ray.influence.config import InfluenceConfig, SjltSketchConfig
    from d3ray.influence.influence import influence_from_lookahead, influence_from_sketches
    from d3ray.influence.worker import InfluenceWorker

    golden = dict(np.load(GOLDEN))
    model = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=32).to_dict()
    weights = {k[len("weights/"):]: v for k, v in golden.items() if k.startswith("weights/")}
    batches, ids = list(golden["batches"]), list(range(6))
    base = {"dtype": "float64", "device": "cpu", "gamma": 0.01, "sketch": SjltSketchConfig(k=64, seed=3)}
    look = InfluenceConfig(estimator="lookahead", sample_fraction=1.0, **base)
    rows = InfluenceWorker(model, look).lookahead_matrix(weights, batches, ids)
    golden["lookahead_A"] = influence_from_lookahead([rows], ids)[0]
    for name in ("first_order", "fisher", "gnb", "hutchinson"):
        for cv in (True, False):
            config = InfluenceConfig(estimator=name, control_variate=cv, sample_fraction=0.75, seed=5, **base)
            part = InfluenceWorker(model, config).sketch_batches(weights, batches, ids)
            A, S, _ = influence_from_sketches([part], ids, config.gamma)
            golden[f"{name}_cv{int(cv)}_A"], golden[f"{name}_cv{int(cv)}_S"] = A, S
    np.savez(GOLDEN, **golden)
    print(f"wrote {GOLDEN}")


if __name__ == "__main__":
    main(sys.argv[1])
