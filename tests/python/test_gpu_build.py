"""A GPU-built library on a host without a GPU (ARCHITECTURE.md §4, §8): it imports (the runtime
is not needed until a GPU op runs), reports its archs with their FP8 flavour, still runs CPU tensors
on the CPU kernels, and answers a GPU op with a clear NVTE_ERROR_UNSUPPORTED. Runs against the
loaded library (ci/build_cuda.sh and ci/build_rocm.sh point NVTE_LIB_PATH at their builds); skipped
for a CPU-only build, and on a host that has a GPU (the GPU gtests cover that)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import require_ops

from transformer_engine_lite.common import build_info, capi, get_lib

GPU_BACKENDS = {"cuda", "rocm"}
DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd")


@pytest.fixture(scope="module", autouse=True)
def gpu_build_without_gpu():
    backends = set(build_info()["device_backends"])
    if not backends & GPU_BACKENDS:
        pytest.skip(f"CPU-only build (device backends {sorted(backends)})")
    present = [n for n in DEVICE_NODES if Path(n).exists()]
    if present:
        pytest.skip(f"this host has a GPU ({', '.join(present)})")


def test_build_info_lists_archs_and_fp8_flavour():
    info = build_info()
    archs, fp8 = info["gpu_archs"], info["gpu_fp8"]
    assert archs and set(fp8) == set(archs)
    for arch in archs:
        expected = "fnuz" if arch.startswith("gfx94") else "ocp"  # MI300 FNUZ; OCP elsewhere
        assert fp8[arch] == expected, (arch, fp8[arch])
    if "cuda" in info["device_backends"]:
        assert all(a.startswith("sm_") for a in archs)


def _quantize_pair(on_gpu: bool):
    x = torch.randn(4, 8)
    q = torch.empty(4, 8, dtype=torch.float8_e4m3fn)
    tx = capi.Tensor(x)
    tq = capi.Tensor(q, scale=torch.ones(1), amax=torch.zeros(1), scale_inv=torch.ones(1))
    if on_gpu:  # host pointers, GPU tags: the op must stop before touching them
        for t in (tx, tq):
            capi.check(get_lib().nvte_set_tensor_device(t.handle, 1))
    return x, q, tx, tq


def test_gpu_op_without_device_is_unsupported_with_a_clear_message():
    require_ops("nvte_quantize")
    *_, tx, tq = _quantize_pair(on_gpu=True)
    with pytest.raises(capi.NVTEUnsupported) as e:
        capi.call("nvte_quantize", tx, tq, None)
    msg = str(e.value)
    assert e.value.status == capi.Status.UNSUPPORTED
    assert "nvte_quantize" in msg and "no GPU device is usable" in msg, msg


def test_cpu_tensors_still_run_on_the_cpu_kernels():
    require_ops("nvte_quantize")
    x, q, tx, tq = _quantize_pair(on_gpu=False)
    capi.call("nvte_quantize", tx, tq, None)
    assert torch.equal(q.view(torch.uint8), x.to(torch.float8_e4m3fn).view(torch.uint8))


def test_build_info_lists_the_aotriton_images():
    """A GPU build with AOTriton images reports exactly the archs of its index; without a device
    the selection does not pick aotriton for GPU tensors (the arch is unknown), naming why."""
    import json
    import os

    info = build_info()
    index = Path(os.environ.get("NVTE_LIB_PATH", "")) / "aotriton" / "index.json"
    if not index.is_file():  # e.g. the installed package: its build folder is elsewhere
        pytest.skip(f"no AOTriton index beside this library ({index})")
    archs = json.loads(index.read_text())["archs"]
    assert info["aotriton_archs"] == archs
    fam = "gfx" if "rocm" in info["device_backends"] else "sm_"
    assert archs and all(a.startswith(fam) for a in archs), archs
    bf16 = int(capi.DType.BFloat16)
    layout = capi.qkv_layout_names().index("bshd_bshd_bshd")
    cfg = capi.NVTEFusedAttnConfig(1, bf16, bf16, layout, 0, 0, 0.0, 4, 4, 64, 64, 64, 64, -1, -1)
    _, reasons = capi.fused_attn_backend_reasons(cfg)
    aot = capi.fused_attn_backend_names().index("aotriton")
    assert "no GPU arch is known" in reasons[aot], reasons[aot]


def test_index_covers_every_variant_the_rules_accept():
    """For each arch with images: every (dtype, head dims) the aotriton rules accept through
    NVTEFusedAttnPlatform has all four kernels in the index (the smallest BLOCK_D that holds the
    head dim, both stride variants), and the rules reject what has none."""
    import json
    import os

    index = Path(os.environ.get("NVTE_LIB_PATH", "")) / "aotriton" / "index.json"
    if not index.is_file():
        pytest.skip(f"no AOTriton images in this build ({index})")
    idx = json.loads(index.read_text())
    have = {(e["arch"], e["kernel"], e["dtype"], e["block_d"], e["stride_align"])
            for e in idx["kernels"]}
    kernels = ("attn_fwd", "attn_bwd_preprocess", "attn_bwd_dkdv", "attn_bwd_dq")
    names = {int(capi.DType.BFloat16): "bf16", int(capi.DType.Float16): "fp16"}
    layout = capi.qkv_layout_names().index("bshd_bshd_bshd")
    aot = capi.fused_attn_backend_names().index("aotriton")
    rocm = "rocm" in build_info()["device_backends"]
    accepted = 0
    for arch in idx["archs"]:
        pf = capi.NVTEFusedAttnPlatform(rocm, False, True, True, arch.encode(),
                                        ",".join(idx["archs"]).encode())
        for dt in (*names, int(capi.DType.Float32)):
            for d_qk, d_v in [(d, d) for d in range(1, 200)] + [(64, 32), (128, 64)]:
                cfg = capi.NVTEFusedAttnConfig(1, dt, dt, layout, 0, 0, 0.0, 4, 4, 64, 64, d_qk,
                                               d_v, -1, -1)
                ok = capi.fused_attn_backend_reasons(cfg, pf)[1][aot] == ""
                bd = next((b for b in (64, 128) if d_qk <= b), None)
                exists = dt in names and d_qk == d_v and bd is not None and all(
                    (arch, k, names[dt], bd, a) in have for k in kernels for a in (1, 16))
                assert ok == exists, (arch, dt, d_qk, d_v, ok, exists)
                accepted += ok
    assert accepted == len(idx["archs"]) * 2 * 128
