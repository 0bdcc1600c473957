"""The step a batch causes: a plain gradient step −γ·g, or the trainers' AdamW step (preconditioner).

D3's influence I[i→j] = ℓ(B_j; θ + Δθ_i) − ℓ(B_j; θ) depends on the step Δθ_i that training on batch i
takes. The paper uses Δθ_i = −γ·g_i. The trainers run AdamW (torch.optim.AdamW semantics, which is
what DeepSpeed's ``torch_adam`` runs), whose step from the state (m, v, t) with gradient g is

    m' = β1·m + (1 − β1)·g        v' = β2·v + (1 − β2)·g ⊙ g        t' = t + 1
    Δθ = −η·(λ·θ + m̂ ⊘ (√v̂ + ε)),   m̂ = m' / (1 − β1^t'),   v̂ = v' / (1 − β2^t')

(Loshchilov & Hutter 2019, "Decoupled weight decay regularization", Alg. 2), applied to the gradient
clipped as the trainers clip it, g · min(1, C / (‖g‖ + 1e-6)) (DeepSpeed ``gradient_clipping``,
``torch.nn.utils.clip_grad_norm_``). Both are written
Δθ_i = −η·u_i with a scalar step size η (γ, or the learning rate) and a direction u_i (g_i, or the
bracket above), so that one Taylor form covers both (README.md, "Optimizer-aware influence").

:class:`AdamWState` is the optimizer state that ships with a weights snapshot (float32 numpy or
bfloat16 torch tensors, by parameter name; ``tensors()`` widens them to the compute dtype); it is
validated when it is made, so that a wrong state fails where the snapshot is built, not
inside an influence actor. The clip uses the norm over the parameters that take part: exact when all
do (the benchmark's reference), an approximation under ``param_filter``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from d3ray.influence.config import PRECONDITIONERS
from d3ray.influence.shards import Shards, reduce_sum

logger = logging.getLogger(__name__)

__all__ = ["AdamWState", "adamw_direction", "step_direction"]

Params = dict[str, torch.Tensor]


@dataclass(frozen=True, eq=False)
class AdamWState:
    """AdamW state at a weights snapshot, by parameter name (torch.optim.AdamW semantics).

    Attributes:
        lr: η, the learning rate the next step would use (after the LR schedule).
        betas: (β1, β2).
        eps: ε.
        weight_decay: λ (decoupled).
        step: t, updates taken so far (the next one has bias corrections at t + 1); 0 = fresh optimizer.
        exp_avg: name → m, shaped like the parameter: a float numpy array, or a float torch tensor
            (a 16-bit snapshot ships bfloat16 tensors, views into one packed buffer: numpy has no bfloat16).
        exp_avg_sq: name → v, shaped like the parameter, >= 0; same kinds as ``exp_avg``.
        max_grad_norm: C, the trainer's global gradient-norm clip (0 = none).

    Raises:
        ValueError: a hyperparameter is out of range, m and v disagree on names or shapes, or a
            moment is not a floating-point array or tensor.
    """

    lr: float
    betas: tuple[float, float]
    eps: float
    weight_decay: float
    step: int
    exp_avg: Mapping[str, np.ndarray | torch.Tensor]
    exp_avg_sq: Mapping[str, np.ndarray | torch.Tensor]
    max_grad_norm: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"AdamWState.lr must be a positive finite number, got {self.lr}")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"AdamWState.betas must be two numbers in [0, 1), got {self.betas}")
        if not self.eps > 0:
            raise ValueError(f"AdamWState.eps must be > 0, got {self.eps}")
        if not self.weight_decay >= 0:
            raise ValueError(f"AdamWState.weight_decay must be >= 0, got {self.weight_decay}")
        if self.step < 0:
            raise ValueError(f"AdamWState.step must be >= 0, got {self.step}")
        if not self.max_grad_norm >= 0:
            raise ValueError(f"AdamWState.max_grad_norm must be >= 0, got {self.max_grad_norm}")
        if set(self.exp_avg) != set(self.exp_avg_sq):
            odd = sorted(set(self.exp_avg) ^ set(self.exp_avg_sq))
            raise ValueError(f"AdamWState: exp_avg and exp_avg_sq name different parameters: {odd[:5]}")
        for name, m in self.exp_avg.items():
            m_shape, v_shape = tuple(np.shape(m)), tuple(np.shape(self.exp_avg_sq[name]))
            if m_shape != v_shape:
                raise ValueError(f"AdamWState: {name!r} has exp_avg {m_shape} but exp_avg_sq {v_shape}")
            for label, x in (("exp_avg", m), ("exp_avg_sq", self.exp_avg_sq[name])):
                if not _is_float(x):
                    raise ValueError(
                        f"AdamWState: {label} of {name!r} must be a floating-point numpy array or torch tensor, "
                        f"got {type(x).__name__} of dtype {getattr(x, 'dtype', None)}"
                    )

    @classmethod
    def fresh(cls, shapes: Mapping[str, tuple[int, ...]], **hyper: Any) -> AdamWState:
        """The state before the first step (m = v = 0, t = 0) for parameters of these shapes."""
        zeros = {n: np.zeros(s, dtype=np.float32) for n, s in shapes.items()}
        return cls(step=0, exp_avg=zeros, exp_avg_sq=zeros, **hyper)

    @classmethod
    def from_torch(
        cls, optimizer: torch.optim.Optimizer, named: Iterable[tuple[str, torch.Tensor]], max_grad_norm: float = 0.0
    ) -> AdamWState:
        """The state of a plain ``torch.optim.AdamW`` (one param group) over named parameters, whose
        gradients the training loop clips to ``max_grad_norm`` (0 = not clipped).

        Parameters the optimizer has not stepped yet get zeros; ``step`` is the largest step count.
        """
        group = optimizer.param_groups[0]
        exp_avg, exp_avg_sq, steps = {}, {}, [0]
        for name, p in named:
            st = optimizer.state.get(p, {})
            if "exp_avg" in st:
                exp_avg[name] = np.array(st["exp_avg"].detach().float().cpu().numpy())  # a copy, not a view
                exp_avg_sq[name] = np.array(st["exp_avg_sq"].detach().float().cpu().numpy())
                steps.append(int(st["step"]))
            else:
                exp_avg[name] = np.zeros(tuple(p.shape), dtype=np.float32)
                exp_avg_sq[name] = np.zeros(tuple(p.shape), dtype=np.float32)
        return cls(
            lr=float(group["lr"]),
            betas=(float(group["betas"][0]), float(group["betas"][1])),
            eps=float(group["eps"]),
            weight_decay=float(group["weight_decay"]),
            step=max(steps),
            exp_avg=exp_avg,
            exp_avg_sq=exp_avg_sq,
            max_grad_norm=max_grad_norm,
        )

    def check_covers(self, shapes: Mapping[str, tuple[int, ...]]) -> None:
        """Raise ValueError unless the state holds every named parameter with the same shape."""
        missing = sorted(n for n in shapes if n not in self.exp_avg)
        if missing:
            raise ValueError(
                f"optimizer state lacks {len(missing)} parameter(s) of the model, e.g. {missing[:3]}"
            )
        for name, shape in shapes.items():
            if tuple(np.shape(self.exp_avg[name])) != tuple(shape):
                raise ValueError(
                    f"optimizer state for {name!r} has shape {tuple(np.shape(self.exp_avg[name]))}, "
                    f"the weights {tuple(shape)}"
                )

    def tensors(self, names: Iterable[str], device: torch.device, dtype: torch.dtype) -> tuple[Params, Params]:
        """(m, v) of these parameters as ``dtype`` tensors on ``device``, the compute dtype whatever the
        shipped one (a bfloat16 snapshot is widened here). Read-only for every caller (the directions of
        drift.py and :func:`adamw_direction` make new tensors): a torch tensor already in ``dtype`` on
        ``device`` (the trainers' own state, ``full_optimizer_state``) is used as it is, not copied (the
        copies were a quarter of the in-trainer scoring pass); numpy arrays (from ray.get: read-only) are
        copied."""
        m = {n: _as_tensor(self.exp_avg[n], device, dtype) for n in names}
        v = {n: _as_tensor(self.exp_avg_sq[n], device, dtype) for n in m}
        return m, v


def _is_float(x: Any) -> bool:
    """A floating-point torch tensor or numpy array (any width: bfloat16 exists only in torch)."""
    if torch.is_tensor(x):
        return x.is_floating_point()
    return isinstance(x, np.ndarray) and np.issubdtype(x.dtype, np.floating)


def _as_tensor(x: np.ndarray | torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``x`` (numpy or torch, any float dtype) as a ``dtype`` tensor on ``device``: a torch tensor itself where
    it already is one (detached), else a new tensor."""
    if torch.is_tensor(x):
        return x.detach().to(device=device, dtype=dtype)
    return torch.tensor(np.asarray(x), device=device, dtype=dtype)


def adamw_direction(
    params: Params, grads: Params, state: AdamWState, moments: tuple[Params, Params], shards: Shards | None = None
) -> Params:
    """u with Δθ = −lr·u: one AdamW update from ``state`` with gradient g (module docstring).

    Args:
        params: name → θ (the weight-decay term).
        grads: name → g.
        state: hyperparameters and step count.
        moments: (m, v) of the same names as tensors (see :meth:`AdamWState.tensors`).
        shards: when every tensor is one rank's slice (sharded influence): the clip's norm is summed
            over ranks; everything else is elementwise.
    """
    if state.max_grad_norm > 0:  # the trainers' clip_grad_norm_: coefficient C / (‖g‖ + 1e-6), at most 1
        device = next(iter(grads.values())).device
        squares = sum(((g.double() ** 2).sum() for g in grads.values()), torch.zeros((), dtype=torch.float64, device=device))
        norm = torch.sqrt(reduce_sum(shards, squares))
        # A tensor, not a float: no host synchronisation per batch. g · 1 is g, bit for bit, and a float32
        # coefficient is what multiplying a float32 g by the Python float rounded it to.
        coef = torch.clamp(state.max_grad_norm / (norm + 1e-6), max=1.0)
        grads = {n: g * coef.to(g.dtype) for n, g in grads.items()}
    b1, b2 = state.betas
    t = state.step + 1
    bc1, bc2_sqrt = 1.0 - b1**t, math.sqrt(1.0 - b2**t)
    m0, v0 = moments
    out = {}
    for name, g in grads.items():
        m = m0[name] * b1 + g * (1.0 - b1)
        v = v0[name] * b2 + g * g * (1.0 - b2)
        out[name] = params[name].detach() * state.weight_decay + m / ((v.sqrt() / bc2_sqrt + state.eps) * bc1)
    return out


def step_direction(
    preconditioner: str,
    gamma: float,
    params: Params,
    grads: Params,
    state: AdamWState | None = None,
    moments: tuple[Params, Params] | None = None,
    shards: Shards | None = None,
) -> tuple[float, Params]:
    """(η, u) with Δθ = −η·u for one batch: (γ, g) for ``none`` (u IS g), (lr, AdamW direction) for ``adam``."""
    if preconditioner == "none":
        return gamma, grads
    if preconditioner == "adam":
        if state is None or moments is None:
            raise ValueError("preconditioner 'adam' needs the optimizer state of the weights snapshot")
        return state.lr, adamw_direction(params, grads, state, moments, shards)
    raise ValueError(f"preconditioner must be one of {list(PRECONDITIONERS)}, got {preconditioner!r}")
