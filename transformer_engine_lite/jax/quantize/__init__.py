"""Quantization for the JAX front end (TE-JAX's `transformer_engine.jax.quantize`)."""

from .helper import *  # noqa: F401,F403
from .helper import QuantizeConfig  # noqa: F401
from .quantizer import *  # noqa: F401,F403
from .scaling_modes import *  # noqa: F401,F403
from .tensor import *  # noqa: F401,F403
