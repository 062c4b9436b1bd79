"""Value-opaque quantizers: registration with torch's opaque-object API (torch >= 2.11).

A registered quantizer class is compared / hashed by its annotated fields (see
tensor/_quantizer_value.py), and torch.compile treats its objects as values: a custom op schema
may name the class (torch._library.opaque_object.get_opaque_type_name), dynamo guards on equality
and the generated code rebuilds the object from __fx_repr__.
"""

from __future__ import annotations

import enum
from typing import Any, get_type_hints

from ..tex import DType

__all__ = ["is_value_opaque_quantizer", "register_value_opaque_quantizer"]

# Qualified names, not classes: `type(q).__qualname__ in <set of str>` is something dynamo
# evaluates without a graph break; membership of an opaque class is not.
_VALUE_OPAQUE_QUALNAMES: set[str] = set()

_PLAIN = (int, bool, float, str)


def is_value_opaque_quantizer(quantizer: Any) -> bool:
    """Whether quantizer's class is registered as a torch.compile value type."""
    return type(quantizer).__qualname__ in _VALUE_OPAQUE_QUALNAMES


def _rebuild_quantizer(cls: type, items: tuple[tuple[str, Any], ...]) -> Any:
    """The quantizer of class cls whose value is items (what __fx_repr__ code calls).

    __init__ is bypassed (signatures differ per class and validate arguments already validated):
    the value fields are set directly, then the class rebuilds what is derived from them.
    Attributes outside the value (amax_reduction_group) are absent on the result."""
    obj = cls.__new__(cls)
    for name, value in items:
        object.__setattr__(obj, name, DType(value) if name == "dtype" else value)
    rebuild = getattr(obj, "_rebuild_derived_state", None)
    if rebuild is not None:
        rebuild()
    return obj


def _quantizer_fx_repr(self: Any) -> tuple[str, dict[str, Any]]:
    """An expression rebuilding self, and the globals it needs (the class and the rebuilder).
    TypeError (from _value_key) when self holds a ProcessGroup."""
    cls = type(self)
    items = self._value_key()[1]
    return (
        f"_rebuild_quantizer({cls.__name__}, {items!r})",
        {"_rebuild_quantizer": _rebuild_quantizer, cls.__name__: cls},
    )


def register_value_opaque_quantizer(cls: type) -> None:
    """Give cls value semantics and register it as a torch.compile value opaque type.

    Its annotated fields (across its Quantizer bases) are its value; each must be int, bool,
    float, str or an enum (anything else could neither be hashed into the key nor rebuilt from
    its repr: derive it in `_rebuild_derived_state` instead). On a torch without the
    opaque-object API only the value semantics apply."""
    fields = cls._annotated_fields()
    hints = get_type_hints(cls)
    for name in fields:
        typ = hints[name]
        if typ not in _PLAIN and not (isinstance(typ, type) and issubclass(typ, enum.Enum)):
            raise TypeError(
                f"register_value_opaque_quantizer: {cls.__name__}.{name}: expected an annotation "
                f"of int, bool, float, str or an enum, got {typ!r}"
            )
    cls._value_field_names = tuple(fields)
    cls._value_owner = cls  # see QuantizerValueBase._value_fields
    if "__fx_repr__" not in cls.__dict__:
        cls.__fx_repr__ = _quantizer_fx_repr
    try:
        from torch._library.opaque_object import is_opaque_value_type, register_opaque_type
    except ImportError:
        return
    if not is_opaque_value_type(cls):
        try:
            register_opaque_type(cls, typ="value")
        except TypeError:
            # torch 2.11 (a GPU machine's) takes only subclasses of torch._opaque_base.OpaqueBase;
            # quantizers keep their own bases, so there they are traced as plain objects.
            return
    _VALUE_OPAQUE_QUALNAMES.add(cls.__qualname__)
