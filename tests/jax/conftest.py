import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
# The suites compare against fp64 references.
import jax

jax.config.update("jax_enable_x64", False)
