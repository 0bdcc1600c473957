"""Our checkpoint files load as data only (``weights_only=True`` with a NumPy allowlist): the RNG state a
checkpoint holds and influence means round-trip exactly, and a file that would run code is refused."""

from __future__ import annotations

import enum
import os
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from d3ray.influence.influence import Reference
from d3ray.safe_load import enum_member, load_data


class _RunsCode:
    def __reduce__(self):
        return (os.system, ("touch ran-code",))


def test_load_data_restores_the_rng_state_a_checkpoint_holds(tmp_path: Path) -> None:
    np.random.seed(7)
    random.seed(7)
    torch.manual_seed(7)
    # what d3ray.train.checkpoint.save_checkpoint writes per rank
    torch.save({"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()},
               tmp_path / "rng_rank0.pt")
    expected = (np.random.rand(3), random.random(), torch.rand(2))
    rng = load_data(tmp_path / "rng_rank0.pt")
    torch.set_rng_state(rng["torch"])
    np.random.set_state(rng["numpy"])
    random.setstate(rng["python"])
    assert np.array_equal(np.random.rand(3), expected[0]) and random.random() == expected[1]
    assert torch.equal(torch.rand(2), expected[2])


def test_load_data_reads_influence_means_with_their_class_allowed(tmp_path: Path) -> None:
    means = {4: Reference(vectors={"g": {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}}, count=3)}
    torch.save(means, tmp_path / "influence_means_rank0.pt")
    with pytest.raises(pickle.UnpicklingError):  # a class of ours is read only where it is allowed
        load_data(tmp_path / "influence_means_rank0.pt")
    loaded = load_data(tmp_path / "influence_means_rank0.pt", allow=[Reference])
    assert loaded[4].count == 3 and np.array_equal(loaded[4].vectors["g"]["w"], means[4].vectors["g"]["w"])


def test_load_data_refuses_a_file_that_would_run_code(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    torch.save({"torch": torch.get_rng_state(), "numpy": _RunsCode()}, tmp_path / "rng_rank0.pt")
    with pytest.raises(pickle.UnpicklingError):
        load_data(tmp_path / "rng_rank0.pt")
    assert not (tmp_path / "ran-code").exists()


def test_every_torch_load_of_d3ray_goes_through_load_data() -> None:
    """No module of ours calls ``torch.load`` itself (only ``d3ray/safe_load.py``, weights only): a file from
    elsewhere never runs code through d3ray's own reads (DeepSpeed's loader is its own, README "Security")."""
    import re

    from tests.conftest import REPO

    calls = [f"{path.relative_to(REPO)}:{n}" for path in sorted((REPO / "d3ray").rglob("*.py"))
             if path.name != "safe_load.py"
             for n, line in enumerate(path.read_text().splitlines(), 1) if re.search(r"\btorch\.load\(", line)]
    assert calls == [], f"torch.load outside d3ray/safe_load.py: {calls}"


def test_the_influence_benchmark_weights_cache_reads_back_as_data(tmp_path: Path) -> None:
    """A cached snapshot as ``bench/influence_setup.trained_weights`` writes it (NumPy weights and moments,
    the optimizer's hyperparameters), read by its ``_load``."""
    from d3ray.lab.bench.influence_setup import _load

    weights = {"w": np.linspace(0, 1, 6, dtype=np.float32).reshape(2, 3)}
    optimizer = {"lr": 1e-3, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1, "step": 5,
                 "exp_avg": {"w": np.full((2, 3), 0.5, np.float32)}, "exp_avg_sq": {"w": np.full((2, 3), 0.25, np.float32)},
                 "max_grad_norm": 1.0}
    torch.save({"steps": 5, "weights": weights, "optimizer": optimizer, "loss": 2.5}, tmp_path / "gpt2_x_5.pt")
    snap = _load(tmp_path / "gpt2_x_5.pt")
    assert (snap.steps, snap.loss, snap.optimizer.step, snap.optimizer.betas) == (5, 2.5, 5, (0.9, 0.95))
    assert np.array_equal(snap.weights["w"], weights["w"]) and np.array_equal(snap.optimizer.exp_avg_sq["w"],
                                                                                 optimizer["exp_avg_sq"]["w"])


class _Stage(int, enum.Enum):  # an int-mixin Enum, as DeepSpeed's ZeroStageEnum
    disabled = 0
    gradients = 2


class _ByName:
    """Pickles as ``getattr(cls, name)``: how Python 3.11.2 pickles an int-mixin Enum's member."""

    def __init__(self, cls, name):
        self.cls, self.name = cls, name

    def __reduce__(self):
        return (getattr, (self.cls, self.name))


def test_an_enum_member_pickled_by_name_loads_with_its_class_allowed(tmp_path: Path) -> None:
    torch.save({"zero_stage": _ByName(_Stage, "gradients"), "w": torch.ones(2)}, tmp_path / "optim.pt")
    assert b"getattr" in (tmp_path / "optim.pt").read_bytes()  # the file holds the getattr form
    loaded = load_data(tmp_path / "optim.pt", allow=[_Stage])
    assert loaded["zero_stage"] is _Stage.gradients and torch.equal(loaded["w"], torch.ones(2))
    with pytest.raises(pickle.UnpicklingError):  # the class itself must still be allowed
        load_data(tmp_path / "optim.pt")


def test_getattr_in_a_file_reads_nothing_but_an_enum_member(tmp_path: Path) -> None:
    torch.save({"x": _ByName(np.ndarray, "tofile")}, tmp_path / "method.pt")
    with pytest.raises(pickle.UnpicklingError, match="only an Enum member"):
        load_data(tmp_path / "method.pt")
    torch.save({"x": _ByName(_Stage, "__class__")}, tmp_path / "attr.pt")
    with pytest.raises(pickle.UnpicklingError, match="only an Enum member"):
        load_data(tmp_path / "attr.pt", allow=[_Stage])
    assert enum_member(_Stage, "disabled") is _Stage.disabled
    with pytest.raises(pickle.UnpicklingError):
        enum_member(_Stage, "missing")
