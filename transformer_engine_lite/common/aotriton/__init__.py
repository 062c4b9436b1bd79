"""AOTriton backend: Triton flash-attention kernels (kernels/) compiled ahead of time by
build_tools/aotriton.py and launched by the C++ glue in common/fused_attn_rocm/."""
