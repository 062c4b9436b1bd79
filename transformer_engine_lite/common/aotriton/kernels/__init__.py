"""Triton flash-attention kernels of the AOTriton backend. Imports inside this folder are relative
only: build_tools/aotriton.py loads it as a stand-alone package (the core library may not exist
yet while it builds). variants.py is the ABI and variant table; launch.py a pure-Python launcher
(tests, TRITON_INTERPRET=1)."""
