"""TE's extra-state checkpoint constants. TE-lite checkpoints its FP8 state as plain tensors and
values (module/base.py: get_extra_state), loadable with torch.load(weights_only=True); it never
unpickles, so TE's opt-in for unsafe unpickling of its own pickled extra state has no use here:
such a state is refused with an error that says so, whatever the variable's value."""

UNSAFE_PICKLE_EXTRA_STATE_ENV = "NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE"

from typing import Any

__all__ = ["UNSAFE_PICKLE_EXTRA_STATE_ENV", "check_fp8_param_scales", "fp8_param_scales"]


def fp8_param_scales(module: Any) -> dict[str, Any]:
    """{name: tensor([scale, amax])} of the module's own DelayedScaling FP8 parameters: the scale
    their next re-quantization uses and the amax it is derived from (Float8Quantizer with
    update_margin; see tensor/float8_tensor.py). A checkpoint without them would resume with the
    scale of the loading module's random init."""
    import torch

    from .tensor import Float8Quantizer, QuantizedTensor

    out = {}
    for name, p in module._parameters.items():
        q = getattr(p, "_quantizer", None)
        if isinstance(p, QuantizedTensor) and isinstance(q, Float8Quantizer) and (
            q.update_margin is not None
        ):
            out[name] = torch.cat([q.scale.reshape(1), q.amax.reshape(1)]).detach().cpu()
    return out


def check_fp8_param_scales(owner: str, module: Any, value: Any) -> list[tuple[Any, Any]]:
    """Validates a checkpoint's fp8_param_scales for `module`; returns (quantizer, [scale, amax])
    pairs to assign (nothing is assigned here)."""
    import torch

    mine = fp8_param_scales(module)
    if not isinstance(value, dict):
        raise ValueError(
            f"{owner}: _extra_state: expected fp8_param_scales to be a dict, got "
            f"{type(value).__name__}"
        )
    updates = []
    for name, t in value.items():
        if name not in module._parameters:
            raise ValueError(
                f"{owner}: _extra_state: fp8_param_scales names {name!r}, which is not a "
                f"parameter of this module (those: {sorted(module._parameters)})"
            )
        ok = isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() == 2
        if ok:
            v = t.detach().to(torch.float32).reshape(2)
            ok = bool(torch.isfinite(v[0]) and v[0] > 0 and not torch.isnan(v[1]) and v[1] >= 0)
        if not ok:
            raise ValueError(
                f"{owner}: _extra_state: expected fp8_param_scales[{name!r}] = [scale > 0, "
                f"amax >= 0] (2 floats), got {t!r}"
            )
        if name in mine:  # a high-precision (or other recipe's) parameter has no such state
            updates.append((module._parameters[name]._quantizer, v))
    return updates
