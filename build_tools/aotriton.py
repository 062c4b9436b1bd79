"""Ahead-of-time build of the AOTriton backend: every Triton attention kernel variant of
transformer_engine_lite/common/aotriton/kernels (variants.py lists them; each also with and without
16-element stride alignment) compiled for every target arch with `triton.compile` and a `GPUTarget` (no GPU needed), written into the build tree with an
index. No code object is ever committed.

    python build_tools/aotriton.py build --archs "gfx90a;gfx942" --out <build>/aotriton
        <out>/<arch>/<kernel>_<dtype>_d<BLOCK_D>_a<16|1>.hsaco|.cubin   the images
        <out>/index.json          one entry per image: variant key, arch, entry name, argument
                                  layout (non-constexpr params in order, then Triton's two scratch
                                  pointers), grid rule, num_warps, warp size, shared memory, sha256
        <out>/aotriton_index.cpp  the same table for the C glue, images embedded with .incbin
    python build_tools/aotriton.py verify --out <dir> [--archs ...]
        recompiles into a fresh folder with an empty Triton cache and fails unless every image is
        byte-identical to <dir>'s (the build is reproducible)
    python build_tools/aotriton.py archs --backend rocm|cuda [--gpu-archs "80;90"]
        the default target list (NVTE_AOTRITON_ARCHS overrides it)

Triton's own cache (TRITON_CACHE_DIR, default ~/.triton/cache) makes a rebuild of unchanged kernels
take seconds. Line info is off (TRITON_DISABLE_LINE_INFO=1): smaller cubins, and no source path in
the images, so they are byte-identical wherever the tree lives.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
KERNEL_DIR = REPO / "transformer_engine_lite" / "common" / "aotriton" / "kernels"
PKG = "_te_lite_aotriton_kernels"  # the kernels imported as a stand-alone package (see _kernels)
os.environ.update(TRITON_DISABLE_LINE_INFO="1")
# Fusion is asked for explicitly (off) in _compile_one; setting the default too silences Triton
# 3.9's warning about the default changing in 3.10.
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "0")

# Arch name -> (Triton backend, arch as GPUTarget takes it, warp size).
TARGETS = {
    "gfx90a": ("hip", "gfx90a", 64),
    "gfx942": ("hip", "gfx942", 64),
    "gfx950": ("hip", "gfx950", 64),
    "sm_80": ("cuda", 80, 32),
    "sm_90": ("cuda", 90, 32),
}
SCRATCH_PARAMS = ("global_scratch:*i8", "profile_scratch:*i8")  # Triton >= 3.3 trailing params
# Two variants per kernel: every stride_* a multiple of 16 elements (the compiler then vectorizes
# the tile loads: 128-bit loads and no register spills on sm_80/sm_90), and a fallback for any
# stride (packed layouts with odd head counts, head dims like 40). The glue picks per call.
STRIDE_ALIGNS = (16, 1)


def _kernels():
    """The kernels folder as a package of its own: importing it through transformer_engine_lite
    would load the core library, which does not exist yet while the library is being built."""
    if PKG in sys.modules:
        return sys.modules[PKG]
    spec = importlib.util.spec_from_file_location(
        PKG, KERNEL_DIR / "__init__.py", submodule_search_locations=[str(KERNEL_DIR)]
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules[PKG] = mod
    spec.loader.exec_module(mod)
    return mod


def variants_module():
    _kernels()
    return importlib.import_module(f"{PKG}.variants")


def family(arch: str) -> str:
    return "amd" if TARGETS[arch][0] == "hip" else "nvidia"


def triton_supports(arch: str) -> bool:
    """Whether this Triton's backend knows the arch (gfx950 needs a recent one)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    backend, name, warp = TARGETS[arch]
    try:
        make_backend(GPUTarget(backend, name, warp)).parse_options({})
    except Exception:  # noqa: BLE001 - any refusal means "not supported"
        return False
    return True


def default_archs(backend: str, gpu_archs: str = "") -> list[str]:
    """NVTE_AOTRITON_ARCHS, else ROCm: gfx90a, gfx942 and gfx950 where Triton has it (Triton
    reaches gfx942/gfx950, which the HIP toolchain of the library build may not); CUDA: sm_<arch>
    of the library's arch list (default 80;90)."""
    env = os.environ.get("NVTE_AOTRITON_ARCHS", "").replace(",", ";")
    if env.strip():
        archs = [a.strip() for a in env.split(";") if a.strip()]
        bad = [a for a in archs if a not in TARGETS]
        if bad:
            raise SystemExit(
                f"aotriton.py: NVTE_AOTRITON_ARCHS: expected archs among {sorted(TARGETS)}, "
                f"got {bad}"
            )
        return archs
    if backend == "rocm":
        return [a for a in ("gfx90a", "gfx942", "gfx950") if a == "gfx90a" or triton_supports(a)]
    archs = []
    for a in (gpu_archs or "80;90").replace(",", ";").split(";"):
        a = a.strip().removesuffix("-real").removesuffix("-virtual")
        if a and f"sm_{a}" in TARGETS and f"sm_{a}" not in archs:
            archs.append(f"sm_{a}")
    return archs


def variant_list(archs: list[str]) -> list[dict]:
    """Every (arch, kernel, dtype, BLOCK_D) with its launch config, in index order."""
    v = variants_module()
    out = []
    for arch in archs:
        for kernel in v.KERNELS:
            for dtype in v.DTYPES:
                for block_d in v.BLOCK_DS:
                    cfg = v.config(kernel["name"], family(arch), dtype, block_d)
                    for align in STRIDE_ALIGNS:
                        out.append({
                            "arch": arch, "kernel": kernel["name"], "dtype": dtype,
                            "block_d": block_d, "stride_align": align, "config": cfg,
                        })
    return out


def _compile_one(task: dict, out_dir: str) -> dict:
    """One variant -> its image file and index entry (runs in a worker process)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend

    v = variants_module()
    kernel = next(k for k in v.KERNELS if k["name"] == task["kernel"])
    fn = v.jit_function(kernel["name"])
    cfg = task["config"]
    params = [(n, t.format(dtype=task["dtype"])) for n, t in kernel["params"]]
    constexprs = {
        "BLOCK_M": cfg["BLOCK_M"], "BLOCK_N": cfg["BLOCK_N"], "BLOCK_D": task["block_d"]
    }
    signature = dict(params)
    signature.update({c: "constexpr" for c in kernel["constexprs"]})
    # Pointers are 16-byte aligned (the glue checks it, else the call runs on flash); strides
    # divisible by 16 in the aligned variant.
    hinted = [i for i, name in enumerate(fn.arg_names)
              if signature[name].startswith("*")
              or (task["stride_align"] == 16 and name.startswith("stride_"))]
    attrs = {(i,): [["tt.divisibility", 16]] for i in hinted}
    backend, name, warp = TARGETS[task["arch"]]
    target = GPUTarget(backend, name, warp)
    # No implicit a*b+c contraction, as everywhere in the library (-ffp-contract=off, nvcc
    # --fmad=false): the kernels round as written, like the CPU kernels they are tested against.
    opts = make_backend(target).parse_options(
        {"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"], "enable_fp_fusion": False}
    )
    t0 = time.perf_counter()
    ck = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target,
                        options=opts.__dict__)
    seconds = time.perf_counter() - t0
    ext = "hsaco" if backend == "hip" else "cubin"
    image = ck.asm[ext]
    md = ck.metadata
    for scratch in ("global_scratch_size", "profile_scratch_size"):
        if getattr(md, scratch, 0):
            raise RuntimeError(
                f"{task['kernel']} ({task['arch']}): expected no {scratch}, got "
                f"{getattr(md, scratch)} (the glue passes null scratch pointers)"
            )
    key = f"{task['kernel']}_{task['dtype']}_d{task['block_d']}_a{task['stride_align']}"
    rel = f"{task['arch']}/{key}.{ext}"
    path = Path(out_dir) / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(image)
    return {
        "key": key, "arch": task["arch"], "kernel": task["kernel"], "dtype": task["dtype"],
        "block_d": task["block_d"], "stride_align": task["stride_align"],
        "block_m": cfg["BLOCK_M"], "block_n": cfg["BLOCK_N"],
        "num_stages": cfg["num_stages"], "entry": md.name, "num_warps": md.num_warps,
        "warp_size": md.warp_size, "shared": md.shared,
        "params": [f"{n}:{t}" for n, t in params] + list(SCRATCH_PARAMS),
        "grid": list(kernel["grid"]), "file": rel, "size": len(image),
        "sha256": hashlib.sha256(image).hexdigest(), "compile_s": round(seconds, 2),
        "triton": triton.__version__,
    }


def build(archs: list[str], out: Path, jobs: int, quiet: bool = False) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    tasks = variant_list(archs)
    t0 = time.perf_counter()
    with cf.ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(_compile_one, t, str(out)) for t in tasks]
        entries = []
        for t, f in zip(tasks, futures):
            try:
                entries.append(f.result())
            except Exception as e:  # name the variant that failed, then stop
                raise SystemExit(
                    f"aotriton.py: compiling {t['kernel']} {t['dtype']} BLOCK_D={t['block_d']} "
                    f"stride_align={t['stride_align']} for {t['arch']} failed: "
                    f"{type(e).__name__}: {e}"
                ) from e
    index = {"archs": archs, "kernels": entries}
    (out / "index.json").write_text(json.dumps(index, indent=1) + "\n")
    (out / "aotriton_index.cpp").write_text(cpp_index(index, out))
    if not quiet:
        total = sum(e["size"] for e in entries)
        print(f"aotriton: {len(entries)} images for {', '.join(archs)} "
              f"({total / 1024:.0f} KiB) in {time.perf_counter() - t0:.1f} s -> {out}")
    return entries


def cpp_index(index: dict, out: Path) -> str:
    """The C glue's table (fused_attn_rocm/aotriton_index.h); images embedded by .incbin, so the
    library carries them and nothing is read from disk at run time."""
    lines = [
        "// Generated by build_tools/aotriton.py; do not edit.",
        '#include "fused_attn_rocm/aotriton_index.h"',
        "",
    ]
    for i, e in enumerate(index["kernels"]):
        sym = f"nvte_aotriton_image_{i}"
        path = (out / e["file"]).resolve().as_posix()
        lines.append(
            f'asm(".section .rodata\\n.balign 16\\n.globl {sym}\\n.hidden {sym}\\n{sym}:\\n'
            f'.incbin \\"{path}\\"\\n.previous");'
        )
        lines.append(f'extern "C" const unsigned char {sym}[];')
    lines += ["", "namespace nvte {", "namespace aotriton {", ""]
    lines.append(f'const char kArchs[] = "{",".join(index["archs"])}";')
    lines.append(f"const size_t kKernelCount = {len(index['kernels'])};")
    lines.append("const KernelImage kKernels[] = {")
    for i, e in enumerate(index["kernels"]):
        params = ",".join(e["params"])
        lines.append(
            f'    {{"{e["kernel"]}", "{e["arch"]}", "{e["dtype"]}", {e["block_d"]}, '
            f'{e["stride_align"]}, {e["block_m"]}, {e["block_n"]}, "{e["entry"]}", {e["num_warps"]}, '
            f'{e["warp_size"]}, {e["shared"]}u, "{params}", "{",".join(e["grid"])}", '
            f'nvte_aotriton_image_{i}, {e["size"]}u, "{e["sha256"]}"}},'
        )
    if not index["kernels"]:
        lines.append("    {}")
    lines += ["};", "", "}  // namespace aotriton", "}  // namespace nvte", ""]
    return "\n".join(lines)


def verify(out: Path, archs: list[str] | None, jobs: int) -> int:
    index = json.loads((out / "index.json").read_text())
    archs = archs or index["archs"]
    want = {(e["arch"], e["key"]): e["sha256"] for e in index["kernels"] if e["arch"] in archs}
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.update(TRITON_CACHE_DIR=str(Path(tmp) / "cache"))  # nothing reused
        got = {(e["arch"], e["key"]): e["sha256"]
               for e in build(archs, Path(tmp) / "out", jobs, quiet=True)}
    differ = sorted(k for k in want if got.get(k) != want[k])
    missing = sorted(set(got) ^ set(want))
    if differ or missing:
        print(f"aotriton.py verify: expected byte-identical images, got {len(differ)} different "
              f"({differ[:4]}) and {len(missing)} missing/extra ({missing[:4]})", file=sys.stderr)
        return 1
    print(f"aotriton: rebuild of {len(want)} images ({', '.join(archs)}) with an empty cache is "
          "byte-identical")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--archs", default="", help="';'-separated (default: default_archs)")
    b.add_argument("--backend", choices=("rocm", "cuda"), default="rocm")
    b.add_argument("--gpu-archs", default="", help="the library's arch list (CUDA: 80;90)")
    b.add_argument("--out", type=Path, required=True)
    b.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    vf = sub.add_parser("verify")
    vf.add_argument("--out", type=Path, required=True)
    vf.add_argument("--archs", default="")
    vf.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    a = sub.add_parser("archs")
    a.add_argument("--backend", choices=("rocm", "cuda"), required=True)
    a.add_argument("--gpu-archs", default="")
    args = ap.parse_args(argv)
    split = (lambda s: [x for x in s.replace(",", ";").split(";") if x])
    if args.cmd == "archs":
        print(";".join(default_archs(args.backend, args.gpu_archs)))
        return 0
    if args.cmd == "verify":
        return verify(args.out, split(args.archs) or None, args.jobs)
    archs = split(args.archs) or default_archs(args.backend, args.gpu_archs)
    bad = [x for x in archs if x not in TARGETS]
    if bad:
        raise SystemExit(f"aotriton.py: --archs: expected among {sorted(TARGETS)}, got {bad}")
    if args.out.exists():  # stale images of a previous arch list must not linger
        shutil.rmtree(args.out)
    build(archs, args.out, args.jobs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
