"""Every environment variable the project reads, with default and meaning (the README's table is checked
against this list by tests/python/test_config.py). Readers go through `get()` so parsing is uniform.

This module has no imports from the package, so build_tools can load it by path at build time.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class EnvVar:
    name: str
    default: str | None
    scope: str  # "build" or "runtime"
    meaning: str


ENV_VARS: tuple[EnvVar, ...] = (
    EnvVar("NVTE_USE_CUDA", None, "build",
           "0 forbids the CUDA backend, 1 forces it; unset: CUDA when nvcc is found and the tree has "
           "CUDA kernels"),
    EnvVar("NVTE_USE_ROCM", None, "build", "1 forces the ROCm backend (hipified CUDA sources)"),
    EnvVar("NVTE_CUDA_ARCHS", "80;90", "build", "CUDA architectures of a CUDA build"),
    EnvVar("NVTE_ROCM_ARCH", "gfx942", "build", "AMD GPU architectures of a ROCm build"),
    EnvVar("ROCM_PATH", None, "build",
           "ROCm prefix (default: hipconfig --rocmpath, /opt/rocm, /usr); an automatic build "
           "picks ROCm only where its HIP runtime headers and device libraries are found there"),
    EnvVar("NVTE_FRAMEWORK", None, "build+runtime",
           "pytorch, jax, pytorch,jax, all or none: framework extensions to build / front ends that "
           "may be imported; unset: whatever is importable"),
    EnvVar("NVTE_BUILD_DIR", "build/cmake", "build", "CMake build folder, reused between builds"),
    EnvVar("NVTE_WERROR", "0", "build", "1 compiles the library with -Werror"),
    EnvVar("NVTE_WITH_CUBLASLT", "auto", "build",
           "CUDA builds: 1 requires cuBLASLt (headers from the toolkit or PyPI's nvidia-cublas; "
           "the build fails without it), 0 leaves it out, auto uses it when found and otherwise "
           "builds the tiled GEMM only (one line in the build log; build_info()['gpu_gemm'])"),
    EnvVar("NVTE_WITH_AOTRITON", "auto", "build",
           "GPU builds: auto compiles the AOTriton images (the Triton attention kernels, ahead of "
           "time, build_tools/aotriton.py) when Python can import triton; 1 requires them; 0 "
           "leaves them out (build_info()['aotriton_archs'] lists what was built)"),
    EnvVar("NVTE_AOTRITON_ARCHS", None, "build",
           "archs of the AOTriton images, ';'-separated among gfx90a, gfx942, gfx950, sm_80, "
           "sm_90 (default: gfx90a;gfx942 and gfx950 where triton has it on ROCm; sm_<arch> of "
           "NVTE_CUDA_ARCHS on CUDA)"),
    EnvVar("DNNL_ROOT", None, "build",
           "prefix holding oneDNN's include/ and lib/ (default: the Python prefix, where PyPI's "
           "onednn-cpu-gomp and onednn-devel-cpu-gomp install)"),
    EnvVar("MAX_JOBS", None, "build", "parallel compile jobs (default: number of cores)"),
    EnvVar("NVTE_LIB_PATH", None, "runtime",
           "file or folder of libtransformer_engine_lite.so to load instead of the installed one"),
    EnvVar("OMP_NUM_THREADS", None, "runtime", "threads of the CPU kernels (OpenMP)"),
    EnvVar("NVTE_CPU_ISA", "native", "runtime",
           "caps the CPU level of the library's own kernels: baseline, avx2, avx512_core, "
           "avx512_core_bf16, avx512_core_fp16, avx512_core_amx or native (per-level loop clones "
           "x86-64-v4/v3/baseline; the AVX-512 BF16 tile kernels); also caps oneDNN unless "
           "ONEDNN_MAX_CPU_ISA is set. Read once per process; build_info()['cpu_isa'] reports it"),
    EnvVar("ONEDNN_MAX_CPU_ISA", None, "runtime",
           "oneDNN's own cap of its kernels' ISA (e.g. AVX2, AVX512_CORE_BF16); wins over "
           "NVTE_CPU_ISA for oneDNN; build_info()['onednn_isa'] reports the level in use"),
    EnvVar("NVTE_CPU_GEMM_COMPUTE", "auto", "runtime",
           "operand precision of the CPU GEMM and flash-attention tiles: auto (GEMM: the CPU's "
           "fastest exact path, build_info()['cpu_isa']['matmul_path']: bf16 tiles/dot products "
           "as they are, FP8 as bf16, on AMX and AMD AVX-512 BF16 CPUs; every operand widened "
           "exactly to fp32 on other CPUs, for GEMMs with both output dims >= 128; attention: "
           "bf16 operands on the same matmul path: AMX tiles, AMD's dot products; fp32 tiles "
           "elsewhere), native (never widen to fp32: "
           "NotImplementedError where oneDNN lacks the kernel), fp32 (always widen)"),
    EnvVar("NVTE_FP8_CURRENT_SCALING_POWER_2_SCALES", "0", "runtime",
           "1: Float8CurrentScaling() defaults to use_power_2_scales=True (power-of-two scales "
           "for every tensor role)"),
    EnvVar("NVTE_FP8_BLOCK_SCALING_FP32_SCALES", "0", "runtime",
           "1: Float8BlockScaling() defaults to fp32 scales (default: power-of-two scales, "
           "as TE)"),
    # NVFP4BlockScaling() defaults (TE's variables); the recipe's kernels are not implemented
    # (issue #24), so they only shape the recipe object.
    EnvVar("NVTE_NVFP4_DISABLE_RHT", "0", "runtime",
           "1: NVFP4BlockScaling() defaults to disable_rht=True (no random Hadamard transforms)"),
    EnvVar("NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING", "0", "runtime",
           "1: NVFP4BlockScaling() defaults to disable_stochastic_rounding=True"),
    EnvVar("NVTE_NVFP4_DISABLE_2D_QUANTIZATION", "0", "runtime",
           "1: NVFP4BlockScaling() defaults to disable_2d_quantization=True (1D blocks for "
           "weights)"),
    EnvVar("NVTE_NVFP4_ROW_SCALED_ACTIVATION", "0", "runtime",
           "1: NVFP4BlockScaling() defaults to row_scaled_activation=True"),
    EnvVar("NVTE_NVFP4_4OVER6", "none", "runtime",
           "NVFP4BlockScaling() default nvfp4_4over6: none, weights, activations or all"),
    EnvVar("NVTE_NVFP4_4OVER6_E4M3_USE_256", "all", "runtime",
           "NVFP4BlockScaling() default nvfp4_4over6_e4m3_use_256: none, weights, activations or "
           "all"),
    EnvVar("NVTE_NVFP4_4OVER6_ERR_MODE", "MAE", "runtime",
           "NVFP4BlockScaling() default nvfp4_4over6_err_mode: MAE or MSE (case-insensitive)"),
    EnvVar("NVTE_NVFP4_4OVER6_ERR_USE_FAST_MATH", "0", "runtime",
           "1: `NVFP4Quantizer(nvfp4_use_4over6=True)` measures candidate errors in the "
           "E4M3-scaled domain (TE's fast path; read at each quantize; still bit-exact with TE's "
           "reference)"),
    EnvVar("NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE", "0", "runtime",
           "TE's opt-in to unpickling a checkpoint's pickled _extra_state (TE's uint8-tensor / "
           "BytesIO form). TE-lite loads stateless pickled payloads without unpickling either way; "
           "a stateful one (TE's delayed scaling, unknown) raises TE's security advisory when "
           "unset, and when 1 is unpickled with TE's class paths mapped to ours and its amax "
           "histories / scales loaded (pytorch/_extra_state.py). Our own extra state never needs "
           "it"),
    EnvVar("TE_LITE_AS_TRANSFORMER_ENGINE", "0", "runtime",
           "1: at interpreter start (the transformer_engine_lite_as_te.pth hook the package "
           "installs) map `transformer_engine`, `transformer_engine.<sub>` and "
           "`transformer_engine_torch` to this package, so unmodified TE code runs on it; "
           "never when a real TE is installed (see README: Running unmodified TE code)"),
    EnvVar("NVTE_BACKWARD_OVERRIDE", "", "runtime",
           "default backward_override of the FP8 recipes (read when a recipe is created): unset "
           "(backward GEMMs in FP8), high_precision (backward GEMMs on the unquantized inputs "
           "and weights) or dequantized (on the forward's quantized operands, dequantized; "
           "gradients unquantized); DelayedScaling accepts only unset"),
    EnvVar("NVTE_GROUPED_LINEAR_SINGLE_PARAM", "0", "runtime",
           "TE's gate on GroupedLinear(single_grouped_weight / single_grouped_bias) (read when the "
           "module is built): an integer > 0 keeps one [num_gemms, out, in] weight / [num_gemms, "
           "out] bias (warning that the feature is experimental); 0 turns both flags off with a "
           "warning, giving per-expert weight0.. / bias0.. parameters"),
    EnvVar("NVTE_JAX_CUSTOM_CALLS", None, "runtime",
           "JAX front end: 'false' runs every primitive as its pure-JAX reference instead of the "
           "XLA FFI handler; 'Name=false,Name2=true,...' per primitive (TE-JAX class names, e.g. "
           "GemmPrimitive, NormFwdPrimitive, QuantizePrimitive, ActLuPrimitive); unset = all FFI"),
    EnvVar("NVTE_FUSED_RING_ATTENTION_USE_SCAN", "0", "runtime",
           "JAX front end, ring context parallelism of fused_attn (CPStrategy.RING): 1 runs the "
           "cp ring steps in a fori_loop (one compiled step), 0 unrolls them"),
    EnvVar("NVTE_TORCH_COMPILE", "1", "runtime",
           "PyTorch front end (TE's switch, read at import): 1 compiles the pytorch.jit functions "
           "(L2 normalization of QK norm, GeLU, bias-dropout-add) with torch.compile on their first "
           "call; 0 runs them eagerly"),
    # Attention backend selection (common/fused_attn/backend_select.cpp). Switches: only the exact
    # string 0 disables; logging: only the exact string 1 enables.
    EnvVar("NVTE_FUSED_ATTN", "1", "runtime",
           "0 disables the fused GPU attention backends ck and aotriton (master switch)"),
    EnvVar("NVTE_FUSED_ATTN_CK", None, "runtime",
           "0 disables the ck attention backend; unset: follows NVTE_FUSED_ATTN"),
    EnvVar("NVTE_FUSED_ATTN_AOTRITON", None, "runtime",
           "0 disables the aotriton attention backend; unset: follows NVTE_FUSED_ATTN"),
    EnvVar("NVTE_FLASH_ATTN", "1", "runtime", "0 disables the flash attention backend"),
    EnvVar("NVTE_GPU_FLASH_ATTN_TENSOR_CORES", "1", "runtime",
           "1 (default): the CUDA flash attention forward runs its QK^T and PV tile products on "
           "tensor cores (mma.sync m16n8k16, sm_80+; bf16/fp16, head dims up to 128; P rounded to the "
           "input dtype before P.V); proven on an H200 by ci/gpu_check.sh. 0: the fp32 FMA kernel. "
           "AMD GPUs always run the fp32 kernel; gpusim's cuda flavour runs the tensor-core path, its "
           "rocm flavour the fp32 kernel"),
    EnvVar("NVTE_UNFUSED_ATTN", "1", "runtime",
           "0 disables the unfused attention backend (framework math)"),
    EnvVar("NVTE_FP8_DPA_BWD", "1", "runtime",
           "FP8 attention (recipe fp8_dpa / fp8_mha): 0 runs its backward in high precision (no "
           "dO / dP / dQKV quantization)"),
    EnvVar("NVTE_DPA_FP8_RECIPE", "", "runtime",
           "FP8 attention: 'F16' runs attention in high precision under an fp8_dpa / fp8_mha "
           "recipe; unset or '' follows the recipe (TE's switches to another recipe are not "
           "implemented)"),
    EnvVar("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "1", "runtime",
           "JAX front end (TE-JAX's switch): 0 runs the attention backward's deterministic "
           "algorithm (GPU flash: no atomics in dQ); the CPU backward is deterministic either way"),
    EnvVar("NVTE_LOG_FUSED_ATTN_CONFIG", "0", "runtime",
           "1 logs every attention backend selection to stderr: dtype, layout, bias, mask, "
           "h/h_kv/s_q/s_kv/d_qk/d_v, window, dropout, device, the chosen backend and why the "
           "others were rejected"),
    EnvVar("NVTE_LOG_CK_CONFIG", "0", "runtime",
           "1 logs whether ck is eligible for each selection, and why not, on a platform with ck"),
    EnvVar("NVTE_LOG_AOTRITON_CONFIG", "0", "runtime",
           "1 logs whether aotriton is eligible for each selection, and why not, on a platform "
           "with aotriton"),
    EnvVar("CK_FUSED_ATTN_LOG_CONFIG", "0", "runtime",
           "1 logs the CK kernel arguments in builds with ck; no build of this project has ck "
           "yet, so it has no effect (listed for TE users)"),
    EnvVar("NVTE_DEBUG", "0", "runtime",
           "1 enables the front ends' debug logging (attention backend selection)"),
    EnvVar("NVTE_DEBUG_LEVEL", "0", "runtime",
           "with NVTE_DEBUG=1: 0 warnings, 1 info (selected backend), 2 debug (every rejected "
           "backend and why)"),
    EnvVar("GPUSIM_WORKERS", None, "runtime",
           "gpusim builds (NVTE_BACKEND=gpusim, test infrastructure): host threads that run a "
           "launch's blocks (default: every core; 1 runs blocks in order, for a debugger)"),
    EnvVar("GPUSIM_FILL", "0xFF", "runtime",
           "gpusim builds: the byte fresh device memory and each block's shared memory start as "
           "(0xFF: NaN / -1), so a kernel that reads what nobody wrote shows it in its results"),
    EnvVar("GPUSIM_STACK_KB", "256", "runtime",
           "gpusim builds: stack of each GPU thread (a fiber) in KiB, with a guard page below it; "
           "an overflow is reported naming the kernel and thread"),
    EnvVar("TEST_LEVEL", "99", "ci", "how many configurations ci/*.sh run"),
    EnvVar("TE_LITE_VENV", "build/venv", "ci",
           "virtual environment the README commands create and use (python -m venv, no system "
           "site-packages); 'none' installs into the current Python instead"),
    EnvVar("NVTE_CI_ISA_LEVELS", "avx2 avx512_core avx512_core_bf16 avx512_core_fp16 native",
           "ci", "CPU levels ci/isa_matrix.sh runs the suites at (levels above the CPU's are "
           "reported as skipped; the CPU's own level, with native listed, checks its cap and runs "
           "as native)"),
    EnvVar("NVTE_CI_QEMU", "1", "ci",
           "1: ci/isa_matrix.sh also runs a subset under qemu-x86_64 -cpu Haswell (a CPU without "
           "AVX-512, CPUID included); 0 skips it"),
    EnvVar("NVTE_CI_FUZZ", "1", "ci",
           "0 skips ci/fuzz.sh; otherwise it needs clang with libFuzzer (Debian: clang-15 and "
           "libclang-common-15-dev, installed by ci/install_deps.sh) and fails naming them when "
           "absent"),
    EnvVar("NVTE_CI_SERIAL", "0", "ci",
           "1 runs ci/run_all.sh's suite pairs (pytorch || jax, integration || fuzz, "
           "isa_matrix || sanitize) one after the other instead of two at a time"),
    EnvVar("NVTE_FUZZ_SECONDS", "20", "ci",
           "seconds each libFuzzer harness of ci/fuzz.sh runs (-seed=1, from a copy of "
           "tests/fuzz/corpus); 0 only replays the committed corpus"),
    EnvVar("NVTE_FUZZ_STATS", "0", "ci",
           "1: a fuzz harness (tests/fuzz) prints per-op counts of successful and rejected calls "
           "at exit (ci/fuzz.sh's corpus replay); 2: also one line per call "
           "(tests/fuzz/make_corpus.py)"),
    EnvVar("NVTE_GPUSIM_BUILD_DIR", "build/gpusim", "ci",
           "folder of ci/gpusim.sh's builds (library + tests per flavour, the runtime under "
           "ASan), reused between runs"),
    EnvVar("GPU_CHECK_ARCH", "90", "ci",
           "ci/gpu_check.sh: the one CUDA arch it builds for (the lent GPU's)"),
    EnvVar("GPU_CHECK_BUILD", "build/gpu-check", "ci",
           "ci/gpu_check.sh: its build folder (core, staged Python package, GPU gtests)"),
    EnvVar("GPU_CHECK_CARRY", "build/gpu_check_carry", "ci",
           "ci/gpu_check.sh: what --pack downloads (oneDNN wheels, googletest sources) and the run "
           "on the GPU machine, which has no network, takes from (the device call's carry)"),
    EnvVar("GPU_CHECK_REPEAT", "20", "ci",
           "ci/gpu_check.sh: timed runs per case of its timing table (the median is reported)"),
    EnvVar("GPU_CHECK_ONEDNN", "auto", "ci",
           "ci/gpu_check.sh: where oneDNN (the CPU side of GEMM comparisons) comes from: auto "
           "(DNNL_ROOT, the Python prefix, then the carried wheels), carry, or off"),
    EnvVar("GPU_CHECK_GTEST", "auto", "ci",
           "ci/gpu_check.sh: auto uses the machine's GTest, else the carried sources; carry "
           "always builds the carried sources"),
    EnvVar("GPU_CHECK_STRICT", "0", "ci",
           "1 (set by ci/gpu_check.sh): tests/*/test_gpu_parity.py fail instead of skipping "
           "when no GPU is usable"),
    EnvVar("GPU_PARITY_DEVICE", "cuda (jax: gpu)", "ci",
           "device side of tests/*/test_gpu_parity.py; cpu runs it on the CPU (checks the tests' "
           "own logic on a machine without a GPU)"),
    EnvVar("TEST_FILTER", None, "ci", "space-separated globs over test tags, e.g. 'core.test_gemm'"),
    EnvVar("TEST_SGPU", "1", "ci", "run single-process suites"),
    EnvVar("TEST_MGPU", "1", "ci", "run multi-process suites"),
    EnvVar("TEST_LIST_ONLY", "0", "ci", "1 prints the selected test tags instead of running them"),
    EnvVar("CTEST_TIMEOUT", "600", "ci", "per-test timeout of ctest, seconds"),
    EnvVar("PYTEST_TIMEOUT", "900", "ci", "faulthandler timeout of pytest, seconds"),
    EnvVar("NVTE_ATTN_CI_MODE", None, "ci",
           "attention backend configuration a ci/pytorch.sh run is under (auto, ck, aotriton, "
           "flash, unfused; set by configure_fused_attn_env in ci/_utils.sh)"),
)

_BY_NAME = {v.name: v for v in ENV_VARS}


def get(name: str) -> str | None:
    """Value of a registered variable, or its default; unregistered names are a programming error."""
    if name not in _BY_NAME:
        raise KeyError(f"{name}: not a registered environment variable (add it to ENV_VARS)")
    value = os.environ.get(name)
    return value if value not in (None, "") else _BY_NAME[name].default


def markdown_table() -> str:
    """The README's env-var table."""
    rows = ["| variable | scope | default | meaning |", "|---|---|---|---|"]
    for v in ENV_VARS:
        rows.append(f"| `{v.name}` | {v.scope} | {v.default if v.default is not None else '—'} "
                    f"| {v.meaning} |")
    return "\n".join(rows)
