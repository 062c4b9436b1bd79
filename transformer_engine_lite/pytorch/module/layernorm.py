"""te.LayerNorm and te.RMSNorm over the core's FP32-statistics kernels."""

from __future__ import annotations

from typing import Any

import torch

from ._autograd import NormConfig, norm
from ._params import materialize_params
from .base import TransformerEngineBaseModule, default_device

__all__ = ["LayerNorm", "RMSNorm", "check_normalization", "make_norm_params"]

_NORMS = ("LayerNorm", "RMSNorm")


def check_normalization(owner: str, normalization: str) -> str:
    if normalization not in _NORMS:
        raise ValueError(
            f"{owner}: normalization: expected 'LayerNorm' or 'RMSNorm', got {normalization!r}"
        )
    return normalization


def _hidden(owner: str, hidden_size: Any) -> int:
    if isinstance(hidden_size, (tuple, list, torch.Size)):
        if len(hidden_size) != 1:
            raise NotImplementedError(
                f"{owner}: normalized_shape: only the last dim can be normalized, got {hidden_size}"
            )
        hidden_size = hidden_size[0]
    if not isinstance(hidden_size, int) or hidden_size < 1:
        raise ValueError(f"{owner}: hidden_size: expected an int >= 1, got {hidden_size!r}")
    return hidden_size


def _check_eps(owner: str, eps: Any) -> float:
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not eps >= 0:
        raise ValueError(f"{owner}: eps: expected a number >= 0, got {eps!r}")
    return float(eps)


def make_norm_params(
    module: torch.nn.Module,
    prefix: str,
    normalization: str,
    hidden: int,
    dtype: torch.dtype,
    device: Any,
    sequence_parallel: bool,
) -> None:
    """Registers `{prefix}weight` (and `{prefix}bias` for LayerNorm) on `module`."""
    w = torch.nn.Parameter(torch.empty(hidden, dtype=dtype, device=device))
    module.register_parameter(f"{prefix}weight", w)
    b = None
    if normalization == "LayerNorm":
        b = torch.nn.Parameter(torch.empty(hidden, dtype=dtype, device=device))
    module.register_parameter(f"{prefix}bias", b)
    for p in (w, b):
        if p is not None:
            p.sequence_parallel = sequence_parallel  # type: ignore[attr-defined]


@torch.no_grad()
def reset_norm_params(module: torch.nn.Module, prefix: str, zero_centered_gamma: bool) -> None:
    w = getattr(module, f"{prefix}weight")
    b = getattr(module, f"{prefix}bias")
    if w.device.type == "meta":
        return
    (w.zero_() if zero_centered_gamma else w.fill_(1.0))
    if b is not None:
        b.zero_()


def apply_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    normalization: str,
    eps: float,
    zero_centered_gamma: bool,
) -> torch.Tensor:
    """Norm in x's dtype. gamma/beta are passed as fp32 or in x's dtype (the kernels take either)."""
    if weight.dtype not in (torch.float32, x.dtype):
        weight = weight.to(x.dtype)
        bias = bias.to(x.dtype) if bias is not None else None
    if bias is not None and bias.dtype != weight.dtype:
        bias = bias.to(weight.dtype)
    cfg = NormConfig(normalization, eps, zero_centered_gamma)
    return norm(x, weight, bias if normalization == "LayerNorm" else None, cfg)


class _Norm(torch.nn.Module):
    _kind = "LayerNorm"

    def __init__(
        self,
        normalized_shape: Any = None,
        eps: float = 1e-5,
        sequence_parallel: bool | None = None,
        params_dtype: torch.dtype | None = None,
        zero_centered_gamma: bool = False,
        device: Any = None,
        *,
        hidden_size: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        owner = self._kind
        # TE 2.x names the size normalized_shape (int or 1-tuple) and keeps hidden_size as its
        # deprecated keyword; dtype is TE 2.x's name for params_dtype.
        if (normalized_shape is None) == (hidden_size is None):
            raise TypeError(
                f"{owner}: expected exactly one of normalized_shape and hidden_size, got "
                f"normalized_shape={normalized_shape!r}, hidden_size={hidden_size!r}"
            )
        if dtype is not None and params_dtype is not None and dtype != params_dtype:
            raise ValueError(f"{owner}: dtype={dtype} and params_dtype={params_dtype} disagree")
        params_dtype = params_dtype or dtype
        self.hidden_size = _hidden(owner, normalized_shape if hidden_size is None else hidden_size)
        self.normalized_shape = (self.hidden_size,)
        self.eps = _check_eps(owner, eps)
        self.zero_centered_gamma = bool(zero_centered_gamma)
        self.sequence_parallel = bool(sequence_parallel)
        dev = torch.device(device) if device is not None else default_device()
        make_norm_params(
            self,
            "",
            self._kind,
            self.hidden_size,
            params_dtype or torch.get_default_dtype(),
            dev,
            self.sequence_parallel,
        )
        self.reset_parameters(defer_init=dev.type == "meta")  # TE: "meta" defers init

    def reset_parameters(self, defer_init: bool = False) -> None:
        if not defer_init:
            materialize_params(self)  # TE's deferred init: "meta" parameters are allocated here
            reset_norm_params(self, "", self.zero_centered_gamma)

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        owner = self._kind
        TransformerEngineBaseModule._check_last_dim(owner, inp, self.hidden_size, "hidden_size")
        dtype = TransformerEngineBaseModule._activation_dtype(owner, inp)
        x = inp if inp.dtype == dtype else inp.to(dtype)
        return apply_norm(x, self.weight, self.bias, self._kind, self.eps, self.zero_centered_gamma)

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, eps={self.eps}, zero_centered_gamma={self.zero_centered_gamma}"


class LayerNorm(_Norm):
    """y = (x - mean) / sqrt(var + eps) * gamma + beta over the last dim (TE's LayerNorm).

    hidden_size (or TE 2.x's normalized_shape as a 1-tuple), eps, sequence_parallel (marks the
    parameters `sequence_parallel` so their gradients get all-reduced over the TP group),
    params_dtype, zero_centered_gamma (gamma stored as gamma - 1, initialized to 0), device.
    Statistics are computed in FP32.
    """

    _kind = "LayerNorm"


class RMSNorm(_Norm):
    """y = x / sqrt(mean(x^2) + eps) * gamma over the last dim (TE's RMSNorm). Same arguments as
    LayerNorm; no bias."""

    _kind = "RMSNorm"
