"""Read our own ``torch.save`` files as data only: ``torch.load(..., weights_only=True)`` with an allowlist.

A checkpoint may come from elsewhere (``train.init_checkpoint`` on shared storage, ``d3ray export`` of a
downloaded run), and unpickling an arbitrary file can run code. PyTorch's weights-only unpickler builds
tensors, containers and numbers only, plus the globals named here: NumPy arrays and dtypes (the NumPy RNG
state of ``rng_rank<r>.pt``, influence means, benchmark weights) and the few plain dataclasses of ours
that such files hold. Anything else in a file fails to load (``pickle.UnpicklingError``) instead of
running. DeepSpeed's own checkpoint loader (``engine.load_checkpoint``, its ZeRO shard reader) unpickles
its files itself; the README's Security section says so.

An Enum member may be pickled by name, ``getattr(ZeroStageEnum, "gradients")``: Python 3.11.2 (Debian 12's)
does so for enums mixed with ``int``, and DeepSpeed's ZeRO stage is one, in every ZeRO-1/2 optimizer file
(3.11.7, 3.12.1 and 3.13.0 write ``ZeroStageEnum(2)``). ``getattr`` itself stays refused: in its place the
unpickler gets :func:`enum_member`, which returns an allowed Enum class's member by name and refuses anything
else.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: NumPy scalar types whose dtypes our files hold (the RNG state is uint32; weights and moments float).
_NUMPY_TYPES = ("uint8", "uint32", "uint64", "int32", "int64", "float16", "float32", "float64", "bool_")


def numpy_safe_globals() -> list[Any]:
    """What unpickling a NumPy array needs: ``ndarray``, ``dtype``, its reconstructor and the dtype classes."""
    import numpy as np

    try:
        from numpy._core.multiarray import _reconstruct  # NumPy 2
    except ImportError:  # NumPy 1
        from numpy.core.multiarray import _reconstruct  # type: ignore[no-redef]
    return [np.ndarray, np.dtype, _reconstruct, *(type(np.dtype(getattr(np, t))) for t in _NUMPY_TYPES)]


def enum_member(cls: Any, name: Any) -> Any:
    """What a weights-only file's ``getattr(cls, name)`` may be: a member of an Enum class, by name.

    Raises:
        pickle.UnpicklingError: ``cls`` is not an Enum class or ``name`` not one of its members.
    """
    import enum
    import pickle

    if isinstance(cls, type) and issubclass(cls, enum.Enum) and isinstance(name, str) and name in cls.__members__:
        return cls[name]
    raise pickle.UnpicklingError(f"getattr({cls!r}, {name!r}) in a weights-only file: only an Enum member by name "
                                 "is read")


def load_data(path: str | Path, allow: Sequence[Any] = (), map_location: Any = None, mmap: bool = False) -> Any:
    """``torch.load(path, weights_only=True)``, NumPy arrays and ``allow`` (classes of ours) allowed;
    ``mmap``: tensors memory-mapped, not read (a header read of a large file).

    Raises:
        pickle.UnpicklingError: the file holds something else (it is not run).
    """
    import torch

    with torch.serialization.safe_globals([*numpy_safe_globals(), (enum_member, "builtins.getattr"), *allow]):
        return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
