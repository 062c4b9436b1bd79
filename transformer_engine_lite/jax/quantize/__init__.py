"""Quantization for the JAX front end (TE-JAX's `transformer_engine.jax.quantize`)."""

from .grouped import *
from .helper import *
from .helper import QuantizeConfig  # noqa: F401
from .quantizer import *
from .scaling_modes import *
from .tensor import *
