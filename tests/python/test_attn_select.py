"""Attention backend selection through the ctypes binding: selections of this build, the env
switches, errors, and the stderr log of NVTE_LOG_FUSED_ATTN_CONFIG / NVTE_LOG_CK_CONFIG (run in a
subprocess, since the library writes straight to file descriptor 2)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from transformer_engine_lite.common import capi, get_lib

AOTRITON, CK, FLASH, UNFUSED, NONE = 0, 1, 2, 3, -1
LAYOUT = {name: i for i, name in enumerate(
    ["sb3hd", "sbh3d", "sbhd_sb2hd", "sbhd_sbh2d", "sbhd_sbhd_sbhd", "bs3hd", "bsh3d", "bshd_bs2hd",
     "bshd_bsh2d", "bshd_bshd_bshd", "t3hd", "th3d", "thd_t2hd", "thd_th2d", "thd_thd_thd"])}
MASK = {name: i for i, name in enumerate(
    ["no_mask", "padding", "causal", "padding_causal", "causal_bottom_right",
     "padding_causal_bottom_right"])}
BIAS = {"no_bias": 0, "pre_scale_bias": 1, "post_scale_bias": 2, "alibi": 3}
SWITCHES = ("NVTE_FUSED_ATTN", "NVTE_FUSED_ATTN_CK", "NVTE_FUSED_ATTN_AOTRITON", "NVTE_FLASH_ATTN",
            "NVTE_UNFUSED_ATTN", "NVTE_LOG_FUSED_ATTN_CONFIG", "NVTE_LOG_CK_CONFIG",
            "NVTE_LOG_AOTRITON_CONFIG")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    if not hasattr(get_lib(), "nvte_fused_attn_backend_reasons"):
        pytest.skip("attention selection not built into this library")
    for var in SWITCHES:
        monkeypatch.delenv(var, raising=False)


def config(device=0, dtype=capi.DType.BFloat16, layout="bshd_bshd_bshd", bias="no_bias",
           mask="no_mask", dropout=0.0, h=8, h_kv=8, s_q=128, s_kv=128, d_qk=64, d_v=64,
           window=(-1, -1), kv_dtype=None) -> capi.NVTEFusedAttnConfig:
    return capi.NVTEFusedAttnConfig(
        device, int(dtype), int(dtype if kv_dtype is None else kv_dtype), LAYOUT[layout],
        BIAS[bias], MASK[mask], dropout, h, h_kv, s_q, s_kv, d_qk, d_v, window[0], window[1])


def test_names_use_te_vocabulary():
    assert capi.qkv_layout_names() == tuple(LAYOUT)
    assert capi.mask_type_names() == tuple(MASK)
    assert capi.bias_type_names() == tuple(BIAS)
    assert capi.fused_attn_backend_names() == ("aotriton", "ck", "flash", "unfused")


@pytest.mark.parametrize("kwargs, expected", [
    ({}, FLASH),
    ({"dtype": capi.DType.Float32, "mask": "causal", "window": (-1, 0)}, FLASH),
    ({"layout": "thd_t2hd", "mask": "padding_causal", "h_kv": 2, "dropout": 0.1}, FLASH),
    ({"bias": "alibi", "mask": "causal_bottom_right", "s_kv": 300}, FLASH),
    ({"bias": "pre_scale_bias"}, UNFUSED),
    ({"d_qk": 512, "d_v": 512}, UNFUSED),
], ids=["default", "fp32_causal", "thd_gqa_dropout", "alibi_bottom_right", "pre_scale_bias",
        "head_dim_512"])
def test_cpu_selection_of_this_build(kwargs, expected):
    cfg = config(**kwargs)
    assert capi.get_fused_attn_backend(cfg) == expected
    selected, reasons = capi.fused_attn_backend_reasons(cfg)
    assert selected == expected
    assert reasons[CK] == reasons[AOTRITON] == "not built in this build"
    assert reasons[expected] == ""


def test_switches_follow_the_ci_modes(monkeypatch):
    cfg = config()
    monkeypatch.setenv("NVTE_FLASH_ATTN", "false")  # only the exact string "0" disables
    assert capi.get_fused_attn_backend(cfg) == FLASH
    monkeypatch.setenv("NVTE_FLASH_ATTN", "0")  # CI mode "unfused" on the CPU
    assert capi.get_fused_attn_backend(cfg) == UNFUSED
    monkeypatch.delenv("NVTE_FLASH_ATTN")
    monkeypatch.setenv("NVTE_FUSED_ATTN", "0")  # CI mode "flash": the master covers ck/aotriton only
    assert capi.get_fused_attn_backend(cfg) == FLASH


def test_explicit_rocm_platforms(monkeypatch):
    ck = capi.NVTEFusedAttnPlatform(True, True, False, True, b"gfx942")
    aot = capi.NVTEFusedAttnPlatform(True, False, True, True, b"gfx90a")
    gpu = config(device=1)
    assert capi.fused_attn_backend_reasons(gpu, ck)[0] == CK
    assert capi.fused_attn_backend_reasons(gpu, aot)[0] == AOTRITON
    selected, reasons = capi.fused_attn_backend_reasons(config(device=1, h_kv=2), aot)
    assert selected == FLASH
    assert "no GQA/MQA" in reasons[AOTRITON]
    monkeypatch.setenv("NVTE_FUSED_ATTN", "0")
    selected, reasons = capi.fused_attn_backend_reasons(gpu, ck)
    assert selected == FLASH
    assert reasons[CK] == "disabled by NVTE_FUSED_ATTN=0 (NVTE_FUSED_ATTN_CK is unset and inherits it)"


def test_nothing_eligible_lists_every_backend(monkeypatch):
    for var in ("NVTE_FUSED_ATTN", "NVTE_FLASH_ATTN", "NVTE_UNFUSED_ATTN"):
        monkeypatch.setenv(var, "0")
    with pytest.raises(capi.NVTEUnsupported) as exc:
        capi.get_fused_attn_backend(config())
    msg = str(exc.value)
    for part in ("ck: not built in this build", "aotriton: not built in this build",
                 "flash: disabled by NVTE_FLASH_ATTN=0", "unfused: disabled by NVTE_UNFUSED_ATTN=0"):
        assert part in msg
    selected, _ = capi.fused_attn_backend_reasons(config())  # not an error for the reasons call
    assert selected == NONE


@pytest.mark.parametrize("kwargs, field", [
    ({"h": 0}, "config.num_attn_heads"),
    ({"h_kv": 0}, "config.num_gqa_groups"),
    ({"window": (-3, 0)}, "config.window_size_left"),
    ({"dropout": float("nan")}, "config.dropout"),
    ({"device": 5}, "config.device"),
])
def test_invalid_config_is_a_value_error(kwargs, field):
    with pytest.raises(capi.NVTEInvalidArgument, match=field):
        capi.get_fused_attn_backend(config(**kwargs))
    with pytest.raises(ValueError, match=field):
        capi.fused_attn_backend_reasons(config(**kwargs))


_LOG_SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    from test_attn_select import config
    from transformer_engine_lite.common import capi
    capi.get_fused_attn_backend(config(mask="causal", h_kv=2, window=(-1, 0), dropout=0.25))
    capi.get_fused_attn_backend(config(bias="pre_scale_bias"))
    ck = capi.NVTEFusedAttnPlatform(True, True, False, True, b"gfx942")
    capi.fused_attn_backend_reasons(config(device=1, bias="pre_scale_bias"), ck)
""")


def _run_logged(env: dict[str, str]) -> list[str]:
    base = {k: v for k, v in os.environ.items() if k not in SWITCHES}
    code = _LOG_SCRIPT.format(tests=os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True,
                       text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    return [line for line in r.stderr.splitlines() if line.startswith("[NVTE]")]


def test_log_fused_attn_config_line():
    lines = _run_logged({"NVTE_LOG_FUSED_ATTN_CONFIG": "1"})
    assert len(lines) == 3, lines  # one line per selection
    assert lines[0] == (
        "[NVTE] fused_attn selection: device=CPU dtype=bfloat16/bfloat16 layout=bshd_bshd_bshd "
        "bias=no_bias mask=causal h=8 h_kv=2 s_q=128 s_kv=128 d_qk=64 d_v=64 window=(-1, 0) "
        "dropout=0.25 -> selected flash (rejected: ck: not built in this build; aotriton: not "
        "built in this build)")
    assert "bias=pre_scale_bias" in lines[1]
    assert lines[1].endswith("-> selected unfused (rejected: ck: not built in this build; "
                             "aotriton: not built in this build; flash: pre_scale_bias is not "
                             "supported by flash (use unfused))")
    assert "device=GPU arch=gfx942" in lines[2]
    assert "ck: pre_scale_bias is not supported by ck" in lines[2]


@pytest.mark.parametrize("value", ["0", "true", "", "01"])
def test_log_needs_exactly_one(value):
    assert _run_logged({"NVTE_LOG_FUSED_ATTN_CONFIG": value, "NVTE_LOG_CK_CONFIG": value}) == []


def test_log_ck_config_only_where_ck_is_on_the_platform():
    lines = _run_logged({"NVTE_LOG_CK_CONFIG": "1"})
    # The first two selections run on this build (no CK); the third on a ROCm+CK platform.
    assert len(lines) == 1, lines
    assert lines[0].startswith("[NVTE] ck: rejected: pre_scale_bias is not supported by ck")
    assert "device=GPU arch=gfx942" in lines[0]
