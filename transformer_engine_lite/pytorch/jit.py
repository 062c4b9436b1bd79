"""TE's `transformer_engine.pytorch.jit`: small element-wise / row-reduction functions that
torch.compile fuses (GeLU and its gradient, bias-dropout-add, L2 normalization), the lazy-compile
decorator behind them, the JIT warm-up helpers and `no_torch_dynamo`.

The functions are plain torch code; compilation is deferred to their first call (`lazy_compile`)
so importing the library stays fast and a process that never calls them never compiles. Here
torch.compile targets the device the tensors are on (the CPU for this build: inductor's C++
backend; it needs a host compiler, present wherever the library itself was built).
NVTE_TORCH_COMPILE=0 runs them eagerly (TE's switch; the results are the same up to rounding).

All of them compute in fp32 where TE does and return the input's dtype; the `*_fused` wrappers
switch autocast off around the call as TE does (autocast would otherwise re-cast the fp32
internals to bf16/fp16).
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch._dynamo  # no_torch_dynamo's torch._dynamo.disable

from ..common import config
from .utils import gpu_autocast_ctx

__all__ = [
    "bgrad_dgelu_fused",
    "bgrad_dgelu_fused_",
    "bias_dropout_add",
    "bias_dropout_add_fused_inference",
    "bias_dropout_add_fused_train",
    "bias_gelu_fused",
    "bias_gelu_fused_",
    "dgelu_fused_",
    "dropout_fuser",
    "gelu_fused_",
    "get_bias_dropout_add",
    "jit_fuser",
    "l2normalization_backward_fused",
    "l2normalization_backward_fused_",
    "l2normalization_fused",
    "l2normalization_fused_",
    "l2normalization_fwd_fused",
    "l2normalization_fwd_fused_",
    "lazy_compile",
    "no_torch_dynamo",
    "set_jit_fusion_options",
    "warmup_jit_bias_dropout_add",
    "warmup_jit_bias_dropout_add_all_dtypes",
    "warmup_jit_bias_gelu",
    "warmup_jit_bias_gelu_all_dtypes",
    "warmup_jit_l2normalization",
    "warmup_jit_l2normalization_all_dtypes",
]


def compile_enabled() -> bool:
    """NVTE_TORCH_COMPILE (default 1): whether the jit_fuser functions are torch.compile'd."""
    value = config.get("NVTE_TORCH_COMPILE")
    try:
        return bool(int(value))  # TE's reading: any integer, non-zero enables
    except ValueError:
        raise ValueError(
            f"NVTE_TORCH_COMPILE: expected an integer (0 or 1), got {value!r}"
        ) from None


def lazy_compile(func: Callable[..., Any]) -> Callable[..., Any]:
    """`func` compiled by torch.compile on its first call (not at decoration). Called while an
    outer torch.compile is tracing, it runs `func` itself so the outer graph inlines it."""
    compiled: list[Callable[..., Any]] = []

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():
            return func(*args, **kwargs)
        if not compiled:
            compiled.append(torch.compile(func))
        return compiled[0](*args, **kwargs)

    wrapper.lazy_compiled = compiled  # type: ignore[attr-defined]  (empty until the first call)
    return wrapper


def _eager(func: Callable[..., Any]) -> Callable[..., Any]:
    return func


# Chosen at import, as in TE: the decorators below are applied when this module loads.
jit_fuser = lazy_compile if compile_enabled() else _eager
# TE scripts dropout with TorchScript on torch < 2.2 (torch.compile mishandled its RNG there);
# the torch this library needs compiles it, so both decorators are the same.
dropout_fuser = jit_fuser


def no_torch_dynamo(
    recursive: bool = True, when: Callable[[dict[str, Any]], str | None] | None = None
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: the function runs eagerly under torch.compile (dynamo skips it; with
    recursive=False only its own frame, not what it calls).

    when(call) -> reason or None makes it conditional: `call` maps parameter names to the
    arguments this call passed (left-out ones are absent); None traces the call as usual, a
    reason runs it eagerly and warns (shown once per distinct reason under Python's default
    warning filters). (TE also lets ONNX export trace
    through; this library has no ONNX export.)"""

    def decorator(func: Callable[..., Any]) -> Callable[..., Any]:
        disabled = torch._dynamo.disable(func, recursive=recursive)
        if when is None:
            return functools.wraps(func)(lambda *a, **k: disabled(*a, **k))
        params = inspect.signature(func).parameters
        if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params.values()):
            # arguments are matched to names by position, which a *args would shift
            raise TypeError(
                f"no_torch_dynamo(when=...): {func.__name__} takes *args, which it cannot name"
            )
        names = list(params)

        def run_eagerly(reason: str, *args: Any, **kwargs: Any) -> Any:
            # Warned on every fallback: Python's warning filters show it once per call site and
            # message by default, and a caller recording warnings (catch_warnings,
            # pytest.warns) sees each fallback, not only the process's first one.
            warnings.warn(
                f"Falling back to eager execution under torch.compile: {reason} is "
                "unsupported on the compiled path (graph-breaks under fullgraph=True).",
                stacklevel=3,
            )
            return func(*args, **kwargs)

        run_eagerly_disabled = torch._dynamo.disable(run_eagerly, recursive=recursive)

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not torch.compiler.is_compiling():
                return func(*args, **kwargs)
            call = dict(zip(names, args))
            call.update(kwargs)
            reason = when(call)
            if reason is None:
                return func(*args, **kwargs)
            return run_eagerly_disabled(reason, *args, **kwargs)

        return wrapper

    return decorator


def set_jit_fusion_options() -> None:
    """TE sets TorchScript/nvFuser flags here for torch < 2.2; with torch.compile (the only path
    of the torch this library needs) there is nothing to set."""


# tanh-approximated GeLU: x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))), TE's constants.
_K0 = 0.79788456  # sqrt(2 / pi)
_K1 = 0.044715
_K2 = 0.1070322243  # 3 * _K0 * _K1: d/dx of the tanh argument's cubic term


def _gelu(x: torch.Tensor) -> torch.Tensor:
    return x * 0.5 * (1.0 + torch.tanh(_K0 * x * (1 + _K1 * x * x)))


def _dgelu(grad_output: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    t = torch.tanh(_K0 * x * (1 + _K1 * x * x))
    return grad_output * (0.5 * x * ((1 - t * t) * (_K0 + _K2 * x * x)) + 0.5 * (1 + t))


@jit_fuser
def bias_gelu_fused_(inp: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """gelu(inp + bias)"""
    return _gelu(inp + bias)


@jit_fuser
def gelu_fused_(inp: torch.Tensor) -> torch.Tensor:
    """gelu(inp) (TE keeps a bias-free copy: its fusers did not take branches)."""
    return _gelu(inp)


@jit_fuser
def bgrad_dgelu_fused_(
    grad_output: torch.Tensor, inp: torch.Tensor, bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(d bias, d inp) of gelu(inp + bias); bias is broadcast over dim 0."""
    dgelu = _dgelu(grad_output, inp + bias)
    return dgelu.sum(dim=0), dgelu


@jit_fuser
def dgelu_fused_(grad_output: torch.Tensor, inp: torch.Tensor) -> torch.Tensor:
    """d inp of gelu(inp)."""
    return _dgelu(grad_output, inp)


@jit_fuser
def l2normalization_fused_(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dim, fp32 inside, x's dtype out (inference)."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.square().sum(dim=-1, keepdim=True) + eps)).to(x.dtype)


@jit_fuser
def l2normalization_fwd_fused_(x: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, r): y as l2normalization_fused_, r = rsqrt(sum(x^2) + eps) in fp32 [..., 1], kept for
    the backward."""
    xf = x.float()
    r = torch.rsqrt(xf.square().sum(dim=-1, keepdim=True) + eps)
    return (xf * r).to(x.dtype), r


@jit_fuser
def l2normalization_backward_fused_(
    grad_output: torch.Tensor, x: torch.Tensor, rsqrt_norm: torch.Tensor, eps: float
) -> torch.Tensor:
    """dx of y = x * r, r = (|x|^2 + eps)^-1/2: dx = r * (dy - x * <x, dy> / (|x|^2 + eps)).
    |x|^2 + eps is recomputed from x (TE's choice: only r is saved); x's dtype out."""
    xf, dyf = x.float(), grad_output.float()
    x_dy = (xf * dyf).sum(dim=-1, keepdim=True)
    denom = xf.square().sum(dim=-1, keepdim=True) + eps
    return (rsqrt_norm * (dyf - xf * (x_dy / denom))).to(x.dtype)


def bias_gelu_fused(inp: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """gelu(inp + bias) (gelu(inp) for no or an empty bias), autocast off."""
    with gpu_autocast_ctx(enabled=False):
        if bias is not None and bias.numel() != 0:
            return bias_gelu_fused_(inp, bias)
        return gelu_fused_(inp)


def bgrad_dgelu_fused(
    grad_output: torch.Tensor, inp: torch.Tensor, bias: torch.Tensor | None
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(d bias or None, d inp) of bias_gelu_fused, autocast off."""
    with gpu_autocast_ctx(enabled=False):
        if bias is not None and bias.numel() != 0:
            return bgrad_dgelu_fused_(grad_output, inp, bias)
        return None, dgelu_fused_(grad_output, inp)


def l2normalization_fused(x: torch.Tensor, eps: float) -> torch.Tensor:
    """l2normalization_fused_ with autocast off."""
    with gpu_autocast_ctx(enabled=False):
        return l2normalization_fused_(x, eps)


def l2normalization_fwd_fused(x: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """l2normalization_fwd_fused_ with autocast off."""
    with gpu_autocast_ctx(enabled=False):
        return l2normalization_fwd_fused_(x, eps)


def l2normalization_backward_fused(
    grad_output: torch.Tensor, x: torch.Tensor, rsqrt_norm: torch.Tensor, eps: float
) -> torch.Tensor:
    """l2normalization_backward_fused_ with autocast off."""
    with gpu_autocast_ctx(enabled=False):
        return l2normalization_backward_fused_(grad_output, x, rsqrt_norm, eps)


def bias_dropout_add(
    x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor, prob: float, training: bool
) -> torch.Tensor:
    """residual + dropout(x + bias, prob) (dropout only when training)."""
    return residual + torch.nn.functional.dropout(x + bias, p=prob, training=training)


def get_bias_dropout_add(training: bool) -> Callable[..., torch.Tensor]:
    """bias_dropout_add with `training` bound: f(x, bias, residual, prob)."""

    def _bias_dropout_add(x, bias, residual, prob):  # type: ignore[no-untyped-def]
        return bias_dropout_add(x, bias, residual, prob, training)

    return _bias_dropout_add


@dropout_fuser
def bias_dropout_add_fused_train_(
    x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor, prob: float
) -> torch.Tensor:
    """bias_dropout_add in training mode."""
    return bias_dropout_add(x, bias, residual, prob, True)


def bias_dropout_add_fused_train(
    x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor, prob: float
) -> torch.Tensor:
    """bias_dropout_add_fused_train_ with grad mode on (as TE: the activation-recompute pass
    calls it under no_grad and needs the graph) and autocast off."""
    with torch.enable_grad(), gpu_autocast_ctx(enabled=False):
        return bias_dropout_add_fused_train_(x, bias, residual, prob)


@dropout_fuser
def bias_dropout_add_fused_inference_(
    x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor, prob: float
) -> torch.Tensor:
    """bias_dropout_add in inference mode (no dropout)."""
    return bias_dropout_add(x, bias, residual, prob, False)


def bias_dropout_add_fused_inference(
    x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor, prob: float
) -> torch.Tensor:
    """bias_dropout_add_fused_inference_ with autocast off."""
    with gpu_autocast_ctx(enabled=False):
        return bias_dropout_add_fused_inference_(x, bias, residual, prob)


# Warm-up: call the functions with the shapes, dtypes and grad modes training will use, so that
# compilation happens before the first step (and forward and activation recompute get the same
# kernels). Inputs are random; the RNG state is restored so warming up does not change training.
_TRAIN_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _check_sizes(owner: str, **sizes: Any) -> None:
    for name, v in sizes.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{owner}: {name}: expected an int >= 1, got {v!r}")


def _device() -> torch.device:
    # where this build's kernels run: the GPU when torch has one, else the CPU (gpu_autocast_ctx's
    # rule)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class _KeepRng:
    def __enter__(self) -> None:
        self.dev = _device()
        self.state = (
            torch.cuda.get_rng_state() if self.dev.type == "cuda" else torch.get_rng_state()
        )

    def __exit__(self, *exc: Any) -> None:
        if self.dev.type == "cuda":
            torch.cuda.set_rng_state(self.state)
        else:
            torch.set_rng_state(self.state)


def warmup_jit_bias_dropout_add(
    hidden_size: int, dtype: torch.dtype, seq_length: int, micro_batch_size: int
) -> None:
    """Compiles bias_dropout_add_fused_train_ for [seq_length, micro_batch_size, hidden_size]."""
    _check_sizes("warmup_jit_bias_dropout_add", hidden_size=hidden_size, seq_length=seq_length,
                 micro_batch_size=micro_batch_size)
    dev = _device()
    with _KeepRng():
        inp = torch.rand(seq_length, micro_batch_size, hidden_size, dtype=dtype, device=dev)
        residual = torch.rand_like(inp)
        bias = torch.rand(hidden_size, dtype=dtype, device=dev)
        # both grad states of the input: the forward (needs grad) and a recompute (may not)
        for input_grad in (False, True):
            inp.requires_grad_(input_grad)
            bias.requires_grad_(True)
            residual.requires_grad_(True)
            for _ in range(5):
                bias_dropout_add_fused_train(inp, bias, residual, 0.1)


def warmup_jit_bias_dropout_add_all_dtypes(
    hidden_size: int, seq_length: int, micro_batch_size: int
) -> None:
    """warmup_jit_bias_dropout_add for fp32, bf16 and fp16."""
    for dtype in _TRAIN_DTYPES:
        warmup_jit_bias_dropout_add(hidden_size, dtype, seq_length, micro_batch_size)


def warmup_jit_bias_gelu(
    ffn_hidden_size_per_partition: int, dtype: torch.dtype, seq_length: int, micro_batch_size: int
) -> None:
    """Compiles bias_gelu_fused_ / gelu_fused_ for [seq_length * micro_batch_size, ffn]."""
    _check_sizes(
        "warmup_jit_bias_gelu",
        ffn_hidden_size_per_partition=ffn_hidden_size_per_partition,
        seq_length=seq_length,
        micro_batch_size=micro_batch_size,
    )
    dev = _device()
    with _KeepRng():
        bias = torch.rand(ffn_hidden_size_per_partition, dtype=dtype, device=dev)
        inp = torch.rand(seq_length * micro_batch_size, ffn_hidden_size_per_partition,
                         dtype=dtype, device=dev)
        for input_grad in (False, True):
            bias.requires_grad_(True)
            inp.requires_grad_(input_grad)
            for _ in range(5):
                bias_gelu_fused_(inp, bias)
                gelu_fused_(inp)


def warmup_jit_bias_gelu_all_dtypes(
    ffn_hidden_size: int, seq_length: int, micro_batch_size: int
) -> None:
    """warmup_jit_bias_gelu for fp32, bf16 and fp16."""
    for dtype in _TRAIN_DTYPES:
        warmup_jit_bias_gelu(ffn_hidden_size, dtype, seq_length, micro_batch_size)


def warmup_jit_l2normalization(
    hidden_size: int, dtype: torch.dtype, seq_length: int, micro_batch_size: int
) -> None:
    """Compiles the three L2-normalization functions for [seq_length * micro_batch_size,
    hidden_size]: the inference one without grad, forward + backward with."""
    _check_sizes("warmup_jit_l2normalization", hidden_size=hidden_size, seq_length=seq_length,
                 micro_batch_size=micro_batch_size)
    with _KeepRng():
        inp = torch.rand(seq_length * micro_batch_size, hidden_size, dtype=dtype, device=_device())
        for input_grad in (False, True):
            inp.requires_grad_(input_grad)
            for _ in range(5):
                if input_grad:
                    y, r = l2normalization_fwd_fused_(inp, 1e-6)
                    l2normalization_backward_fused_(torch.rand_like(y), inp, r, 1e-6)
                else:
                    l2normalization_fused_(inp, 1e-6)


def warmup_jit_l2normalization_all_dtypes(
    hidden_size: int, seq_length: int, micro_batch_size: int
) -> None:
    """warmup_jit_l2normalization for fp32, bf16 and fp16."""
    for dtype in _TRAIN_DTYPES:
        warmup_jit_l2normalization(hidden_size, dtype, seq_length, micro_batch_size)
