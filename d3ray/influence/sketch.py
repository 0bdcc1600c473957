"""Johnson-Lindenstrauss sketches P: R^d → R^k for gradients and Hessian diagonals.

D3 keeps three k-vectors per batch (P g, P(g ⊙ g), P h; docs/design/method.md §4) so that the L x L
matrix A is two small matrix products instead of L² inner products in d ≈ 1e9 dimensions. P is never
materialised as a k x d matrix. A vector is given as a mapping ``name → (n, *shape)`` (n vectors at
once, one tensor per model parameter), and P is defined per parameter *name*, so that

- every process that knows (sketch config, parameter name) builds the same P, whatever the parameter
  order, the parameter filter or the number of workers;
- P is linear and splits over shards: a rank that holds elements [a, a + m) of a parameter projects
  them with ``offsets={name: a}`` and the k-vectors of all ranks sum to the sketch of the whole
  parameter (ZeRO-3, tensor parallel).

Constructions:

- :class:`SparseJLSketch` (default): the block sparse JL transform of Kane & Nelson (2014, "Sparser
  Johnson-Lindenstrauss transforms", J. ACM 61(1), construction (b)): k rows are split into s blocks;
  coordinate c of parameter ``name`` goes to one row of each block with sign ±1/√s. Row and sign come
  from the splitmix64 hash of (seed, name, c, block) computed with int64 tensor ops, so P is identical
  on every device and in every process, costs O(s · d) per vector and needs no stored state (row
  indices are cached up to a memory bound only to save the hashing). E⟨Pu, Pv⟩ = ⟨u, v⟩ exactly,
  because the signs of distinct coordinates are independent.
- :class:`GaussianSketch`: dense N(0, 1/k) (or ±1/√k) entries generated in blocks of columns from a
  generator seeded by (seed, name, block): O(k · d) work, for GPUs and small d. Generated on the
  vectors' device in float32, so P is identical across processes on the same device type.
- :class:`IdentitySketch`: k = d, exact inner products for tests and full-dimension references.
"""

from __future__ import annotations

import hashlib
import logging
import math
import warnings
from collections.abc import Callable, Mapping
from typing import Protocol

import torch

logger = logging.getLogger(__name__)

__all__ = [
    "GaussianSketch",
    "IdentitySketch",
    "Sketch",
    "SparseJLSketch",
    "splitmix64",
    "stable_seed",
]

_GOLDEN = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB
#: Coordinates hashed and scattered per step (bounds the temporary (n, block, s) tensor).
_SJLT_BLOCK = 1 << 18


class Sketch(Protocol):
    """A linear map P: R^d → R^k over named parameter tensors."""

    def project(
        self, vectors: Mapping[str, torch.Tensor], offsets: Mapping[str, int] | None = None
    ) -> torch.Tensor:
        """P v for n vectors at once.

        Args:
            vectors: name → (n, *shape) tensor, all with the same n, dtype and device.
            offsets: name → index of the tensor's first element within the full flattened parameter
                (shards); 0 when absent.

        Returns:
            (n, k) tensor in the vectors' dtype and device.
        """
        ...

    def dim(self, numels: Mapping[str, int]) -> int:
        """k for vectors with these parameter sizes."""
        ...


def stable_seed(*parts: object) -> int:
    """A 63-bit seed from the string forms of ``parts``, equal in every process.

    Python's ``hash`` is salted per process, so it must never seed anything shared.
    """
    text = "\x1f".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") & ((1 << 63) - 1)


def _signed(c: int) -> int:
    """A uint64 constant as the int64 with the same bits (torch has no uint64 arithmetic)."""
    return c - (1 << 64) if c >= 1 << 63 else c


def _shr(x: torch.Tensor, n: int) -> torch.Tensor:
    """Logical right shift of int64 bits (``>>`` on int64 is arithmetic)."""
    return (x >> n) & ((1 << (64 - n)) - 1)


def splitmix64(x: torch.Tensor) -> torch.Tensor:
    """The splitmix64 finaliser (Steele, Lea & Flood 2014) on int64 tensors, bit-exact to the uint64 one.

    Multiplication wraps modulo 2^64 in torch's int64 kernels on CPU and CUDA alike, which is what
    makes the hash (and so P) device independent.
    """
    z = (x ^ _shr(x, 30)) * _signed(_MIX1)
    z = (z ^ _shr(z, 27)) * _signed(_MIX2)
    return z ^ _shr(z, 31)


def _flatten(vectors: Mapping[str, torch.Tensor]) -> tuple[int, list[tuple[str, torch.Tensor]]]:
    """(n, [(name, (n, m) view)]) with checks that all tensors agree on n."""
    items = []
    n = None
    for name, v in vectors.items():
        if v.dim() < 1:
            raise ValueError(f"vector {name!r} needs a leading batch dimension, got shape {tuple(v.shape)}")
        if n is None:
            n = v.shape[0]
        elif v.shape[0] != n:
            raise ValueError(f"vector {name!r} has {v.shape[0]} rows, expected {n}")
        items.append((name, v.reshape(v.shape[0], -1)))
    if n is None:
        raise ValueError("project needs at least one named tensor")
    return n, items


def _reference(vectors: Mapping[str, torch.Tensor]) -> torch.Tensor:
    return next(iter(vectors.values()))


def _nbytes(t: torch.Tensor) -> int:
    if t.layout == torch.sparse_csr:
        return sum(_nbytes(part) for part in (t.crow_indices(), t.col_indices(), t.values()))
    return t.numel() * t.element_size()


class _BoundedCache:
    """Blocks of P kept up to a byte budget (first come, kept; beyond the budget recomputed each time)."""

    def __init__(self, budget_bytes: int) -> None:
        self._entries: dict[tuple, tuple[torch.Tensor, ...]] = {}
        self._left = budget_bytes

    def get(self, key: tuple, make: Callable[[], tuple[torch.Tensor, ...]]) -> tuple[torch.Tensor, ...]:
        hit = self._entries.get(key)
        if hit is not None:
            return hit
        entry = make()
        self._keep(key, entry)
        return entry

    def kept(self, key: tuple, nbytes: int, make: Callable[[], tuple[torch.Tensor, ...]]) -> tuple[torch.Tensor, ...] | None:
        """The entry, made and kept if about ``nbytes`` still fit the budget; None (nothing made) if not."""
        hit = self._entries.get(key)
        if hit is not None or nbytes > self._left:
            return hit
        entry = make()
        self._keep(key, entry)
        return self._entries.get(key)

    def _keep(self, key: tuple, entry: tuple[torch.Tensor, ...]) -> None:
        size = sum(_nbytes(t) for t in entry)
        if size <= self._left:
            self._entries[key] = entry
            self._left -= size


class SparseJLSketch:
    """Block sparse JL / CountSketch (s = 1) with hashed rows and signs; see the module docstring."""

    def __init__(self, k: int, s: int, seed: int, cache_bytes: int = 1 << 30) -> None:
        if k < 1 or not 1 <= s <= k:
            raise ValueError(f"SparseJLSketch needs k >= 1 and 1 <= s <= k, got k={k}, s={s}")
        self.k, self.s, self.seed = k, s, seed
        sizes = [k // s + (1 if block < k % s else 0) for block in range(s)]
        starts = [sum(sizes[:block]) for block in range(s)]
        self._sizes = torch.tensor(sizes, dtype=torch.int64)  # (s,) rows per block
        self._starts = torch.tensor(starts, dtype=torch.int64)  # (s,) first row of each block
        self._cache = _BoundedCache(cache_bytes)

    def dim(self, numels: Mapping[str, int]) -> int:
        return self.k

    def rows_and_signs(
        self, name: str, start: int, stop: int, device: torch.device | str = "cpu"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows (m, s) in [0, k) and signs (m, s) in {−1, +1} of coordinates [start, stop) of ``name``,
        hashed on ``device`` (int64 ops: the same bits on every device, see :func:`splitmix64`)."""
        key = stable_seed("sjlt", self.seed, name)
        coord = torch.arange(start, stop, dtype=torch.int64, device=device)[:, None]  # (m, 1)
        index = coord * self.s + torch.arange(self.s, dtype=torch.int64, device=device)[None, :] + 1  # (m, s)
        z = splitmix64(_signed(key) + index * _signed(_GOLDEN))
        rows = _shr(z, 1) % self._sizes.to(device) + self._starts.to(device)  # (m, s)
        signs = 1 - 2 * (z & 1)  # (m, s)
        return rows, signs

    def _block(self, name: str, start: int, stop: int, device: torch.device, dtype: torch.dtype):
        def make() -> tuple[torch.Tensor, torch.Tensor]:
            rows, signs = self.rows_and_signs(name, start, stop, device)  # hashed where the vectors are
            return rows.reshape(-1), (signs.to(dtype) / math.sqrt(self.s)).reshape(-1)

        return self._cache.get((name, start, stop, str(device), dtype), make)

    def _matrix(self, name: str, start: int, stop: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor | None:
        """Columns [start, stop) of P for ``name`` as a (k, stop − start) CSR matrix, kept in the cache; None
        where the cache has no room for it or the dtype has no sparse product (then :meth:`project` scatters).
        One sparse product per block instead of a scatter: about half the time of the tiny GPT-2's sketch."""
        if dtype not in (torch.float32, torch.float64) or device.type not in ("cpu", "cuda"):
            return None

        def make() -> tuple[torch.Tensor]:
            rows, signs = self.rows_and_signs(name, start, stop, device)  # (m, s)
            cols = torch.arange(stop - start, dtype=torch.int64, device=device).repeat_interleave(self.s)
            vals = (signs.to(dtype) / math.sqrt(self.s)).reshape(-1)
            coo = torch.sparse_coo_tensor(torch.stack([rows.reshape(-1), cols]), vals, (self.k, stop - start),
                                          check_invariants=True)
            with warnings.catch_warnings():  # torch calls its CSR layout beta; the product is all we use of it
                warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
                return (coo.coalesce().to_sparse_csr(),)  # one entry per (row, coordinate): nothing is summed

        nbytes = (self.k + 1) * 8 + (stop - start) * self.s * (8 + torch.finfo(dtype).bits // 8)
        entry = self._cache.kept(("csr", name, start, stop, str(device), dtype), nbytes, make)
        return None if entry is None else entry[0]

    def project(
        self, vectors: Mapping[str, torch.Tensor], offsets: Mapping[str, int] | None = None
    ) -> torch.Tensor:
        n, items = _flatten(vectors)
        ref = _reference(vectors)
        out = torch.zeros(n, self.k, dtype=ref.dtype, device=ref.device)  # (n, k)
        for name, flat in items:  # flat: (n, m)
            base = (offsets or {}).get(name, 0)
            for lo in range(0, flat.shape[1], _SJLT_BLOCK):
                hi = min(lo + _SJLT_BLOCK, flat.shape[1])
                matrix = self._matrix(name, base + lo, base + hi, flat.device, flat.dtype)
                if matrix is not None:
                    out += (matrix @ flat[:, lo:hi].T).T
                    continue
                rows, vals = self._block(name, base + lo, base + hi, flat.device, flat.dtype)
                scattered = (flat[:, lo:hi, None] * vals.view(hi - lo, self.s)).reshape(n, -1)  # (n, m·s)
                out.index_add_(1, rows, scattered)
        return out


class GaussianSketch:
    """Dense JL map with N(0, 1/k) or ±1/√k entries, generated per (name, column block) from the seed."""

    def __init__(
        self, k: int, seed: int, block_size: int = 512, distribution: str = "gaussian", cache_bytes: int = 0
    ) -> None:
        if k < 1 or block_size < 1 or distribution not in ("gaussian", "rademacher"):
            raise ValueError(
                f"GaussianSketch: bad k={k}, block_size={block_size}, distribution={distribution!r}"
            )
        self.k, self.seed, self.block_size, self.distribution = k, seed, block_size, distribution
        self._cache = _BoundedCache(cache_bytes)

    def dim(self, numels: Mapping[str, int]) -> int:
        return self.k

    def block(self, name: str, index: int, width: int, device: torch.device) -> torch.Tensor:
        """Columns [index · block_size, index · block_size + width) of P for ``name``: (k, width) float32."""
        gen = torch.Generator(device=device)
        gen.manual_seed(stable_seed("gaussian", self.seed, name, index))
        shape = (self.k, width)
        if self.distribution == "gaussian":
            raw = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
        else:
            raw = torch.randint(0, 2, shape, generator=gen, device=device).to(torch.float32) * 2 - 1
        return raw / math.sqrt(self.k)

    def _cached_block(self, name: str, index: int, width: int, device: torch.device, dtype: torch.dtype):
        key = (name, index, width, str(device), dtype)
        return self._cache.get(key, lambda: (self.block(name, index, width, device).to(dtype),))[0]

    def project(
        self, vectors: Mapping[str, torch.Tensor], offsets: Mapping[str, int] | None = None
    ) -> torch.Tensor:
        n, items = _flatten(vectors)
        ref = _reference(vectors)
        out = torch.zeros(n, self.k, dtype=ref.dtype, device=ref.device)  # (n, k)
        B = self.block_size
        for name, flat in items:  # flat: (n, m)
            start = (offsets or {}).get(name, 0)
            stop = start + flat.shape[1]
            for index in range(start // B, (stop + B - 1) // B):
                # Blocks are full-width (B columns) so that shards cut anywhere see the same P.
                P = self._cached_block(name, index, B, flat.device, flat.dtype)  # (k, B)
                lo, hi = max(start, index * B), min(stop, (index + 1) * B)
                out += flat[:, lo - start : hi - start] @ P[:, lo - index * B : hi - index * B].T
        return out


class IdentitySketch:
    """P = I: the concatenation of the flattened tensors in mapping order (k = d)."""

    def dim(self, numels: Mapping[str, int]) -> int:
        return sum(numels.values())

    def project(
        self, vectors: Mapping[str, torch.Tensor], offsets: Mapping[str, int] | None = None
    ) -> torch.Tensor:
        if offsets and any(offsets.values()):
            raise ValueError("IdentitySketch cannot project parameter shards (offsets must be 0)")
        _, items = _flatten(vectors)
        return torch.cat([flat for _, flat in items], dim=1)
