"""Per-kernel registers, spills and shared memory of a GPU build (ci/build_cuda.sh, build_rocm.sh).

CUDA: the figures ptxas prints with -Xptxas -v (gpu.cmake's PTXAS_VERBOSE option, as
ci/build_cuda.sh configures it). So that an incremental build still yields the whole table, each
nvcc call runs under this script as the compiler launcher, which keeps the compiler's output in
<object>.ptxas.log and shows everything but the ptxas info lines:

    cmake ... "-DCMAKE_CUDA_COMPILER_LAUNCHER=python;build_tools/kernel_resources.py;capture"

ROCm: the same figures -Rpass-analysis=kernel-resource-usage prints, read from the AMDGPU metadata
note of every code object in the HIP objects (one per arch, exact per arch, no launcher needed):
objcopy extracts .hip_fatbin, clang-offload-bundler unbundles each gfx target, llvm-readelf --notes
prints the metadata.

    python build_tools/kernel_resources.py table --backend cuda|rocm --build-dir build/ci-cuda \\
        --out build/ci-cuda/kernel_resources.txt

AOTriton images (build_tools/aotriton.py's index.json): hsaco from their AMDGPU metadata note
(llvm-readelf), cubins from `cuobjdump -res-usage`; shared memory is the dynamic amount Triton
launches with (the images declare none statically).

    python build_tools/kernel_resources.py aotriton --index <build>/.../aotriton/index.json
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

LOG_SUFFIX = ".ptxas.log"


@dataclass
class KernelUsage:
    kernel: str  # mangled name
    arch: str
    registers: str  # CUDA: per thread; ROCm: "v<VGPR> a<AGPR> s<SGPR>"
    spill_stores: int  # CUDA: bytes; ROCm: VGPRs spilled
    spill_loads: int  # CUDA: bytes; ROCm: SGPRs spilled
    shared: int  # static shared memory / LDS, bytes per block
    stack: int  # CUDA: stack frame bytes; ROCm: scratch bytes per lane
    source: str  # object file, relative to the build folder


# ------------------------------------------------------------------------------------------ CUDA
def capture(cmd: list[str]) -> int:
    """Runs a compiler command; its output goes to <object>.ptxas.log, and minus ptxas info lines
    to stderr."""
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    proc = subprocess.run(
        cmd, check=False, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    out = proc.stdout
    if "-o" in cmd and cmd.index("-o") + 1 < len(cmd):
        Path(cmd[cmd.index("-o") + 1] + LOG_SUFFIX).write_text(out)
    shown = [
        line
        for line in out.splitlines(keepends=True)
        if not line.startswith("ptxas info") and not re.match(r"\s+\d+ bytes stack frame", line)
    ]
    sys.stderr.write("".join(shown))
    return proc.returncode


RE_ENTRY = re.compile(r"ptxas info\s*: Compiling entry function '([^']+)' for '([^']+)'")
RE_PROPS = re.compile(r"ptxas info\s*: Function properties for (\S+)")
RE_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
RE_USED = re.compile(r"ptxas info\s*: Used (\d+) registers")
RE_SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas(text: str, source: str) -> list[KernelUsage]:
    rows: list[KernelUsage] = []
    cur: KernelUsage | None = None
    props_of = None
    for line in text.splitlines():
        if m := RE_ENTRY.search(line):
            cur = KernelUsage(m.group(1), m.group(2), "0", 0, 0, 0, 0, source)
            rows.append(cur)
            props_of = None
        elif m := RE_PROPS.search(line):
            props_of = m.group(1)
        elif (m := RE_FRAME.search(line)) and cur is not None and props_of == cur.kernel:
            cur.stack, cur.spill_stores, cur.spill_loads = (int(g) for g in m.groups())
            props_of = None
        elif (m := RE_USED.search(line)) and cur is not None:
            cur.registers = m.group(1)
            if s := RE_SMEM.search(line):
                cur.shared = int(s.group(1))
    return rows


def cuda_table(build_dir: Path) -> list[KernelUsage]:
    rows = []
    for log in sorted(build_dir.rglob("*" + LOG_SUFFIX)):
        obj = Path(str(log)[: -len(LOG_SUFFIX)])
        if obj.is_file():  # a log whose object is gone belongs to a deleted source
            rows += parse_ptxas(log.read_text(), str(obj.relative_to(build_dir)))
    return rows


# ------------------------------------------------------------------------------------------ ROCm
def _llvm_tool(build_dir: Path, name: str) -> str:
    """An LLVM tool next to the HIP compiler of this build (clang-offload-bundler, llvm-readelf)."""
    m = None
    for info in build_dir.glob("CMakeFiles/*/CMakeHIPCompiler.cmake"):
        m = re.search(r'^set\(CMAKE_HIP_COMPILER "([^"]+)"\)', info.read_text(), re.MULTILINE) or m
    candidates = []
    if m:
        clang = Path(m.group(1)).resolve()
        suffix = re.sub(r"^clang\+\+", "", Path(m.group(1)).name)  # clang++-15 -> -15
        candidates += [clang.parent / name, clang.parent / (name + suffix)]
    for c in candidates:
        if c.is_file():
            return str(c)
    found = shutil.which(name)
    if not found:
        raise SystemExit(
            f"kernel_resources.py: expected {name} next to the HIP compiler or on PATH"
        )
    return found


RE_META_ITEM = re.compile(r"^  - \.(\w+):\s*(.*)$")
RE_META_KEY = re.compile(r"^    \.(\w+):\s*(.*)$")


def parse_amdgpu_notes(text: str, arch: str, source: str) -> list[KernelUsage]:
    kernels: list[dict[str, str]] = []
    in_kernels = False
    for line in text.splitlines():
        if line.startswith("amdhsa.kernels:"):
            in_kernels = True
            continue
        if in_kernels and line and not line.startswith(" "):
            in_kernels = False  # next top-level key
        if not in_kernels:
            continue
        if m := RE_META_ITEM.match(line):
            kernels.append({m.group(1): m.group(2)})
        elif (m := RE_META_KEY.match(line)) and kernels:
            kernels[-1][m.group(1)] = m.group(2)

    def num(k: dict, key: str) -> int:
        return int(k.get(key, "0") or 0)

    return [
        KernelUsage(
            k.get("name", "?"),
            arch,
            f"v{num(k, 'vgpr_count')} a{num(k, 'agpr_count')} s{num(k, 'sgpr_count')}",
            num(k, "vgpr_spill_count"),
            num(k, "sgpr_spill_count"),
            num(k, "group_segment_fixed_size"),
            num(k, "private_segment_fixed_size"),
            source,
        )
        for k in kernels
    ]


def rocm_table(build_dir: Path) -> list[KernelUsage]:
    bundler = _llvm_tool(build_dir, "clang-offload-bundler")
    readelf = _llvm_tool(build_dir, "llvm-readelf")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        fatbin = Path(tmp) / "fatbin"
        for obj in sorted(build_dir.rglob("*.o")):
            if "CMakeFiles" not in obj.parts or obj.name.startswith("CMake"):
                continue
            fatbin.unlink(missing_ok=True)
            # objcopy exits 0 even when the section is missing: the file tells.
            subprocess.run(
                ["objcopy", "--dump-section", f".hip_fatbin={fatbin}", str(obj)],
                check=False,
                capture_output=True,
            )
            if not fatbin.is_file():
                continue  # a host-only object
            targets = subprocess.run(
                [bundler, "--list", "--type=o", f"--input={fatbin}"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split()
            for target in targets:
                if "amdgcn" not in target:
                    continue
                code = Path(tmp) / "code.o"
                subprocess.run(
                    [
                        bundler,
                        "--unbundle",
                        "--type=o",
                        f"--input={fatbin}",
                        f"--targets={target}",
                        f"--output={code}",
                    ],
                    check=True,
                )
                notes = subprocess.run(
                    [readelf, "--notes", str(code)], capture_output=True, text=True, check=True
                ).stdout
                arch = target.rsplit("-", 1)[-1]
                rows += parse_amdgpu_notes(notes, arch, str(obj.relative_to(build_dir)))
    return rows


# -------------------------------------------------------------------------------------- AOTriton
RE_RES_USAGE = re.compile(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)")


def _cuobjdump() -> str:
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:  # the copy PyPI's triton ships
        import triton

        bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        if bundled.is_file():
            return str(bundled)
    except ImportError:
        pass
    raise SystemExit("kernel_resources.py: expected cuobjdump (CUDA toolkit or triton) for cubins")


def aotriton_table(index_path: Path, build_dir: Path | None) -> str:
    import json

    index = json.loads(index_path.read_text())
    rows = []
    readelf = cuobjdump = None
    for e in index["kernels"]:
        image = index_path.parent / e["file"]
        name = f"{e['kernel']} {e['dtype']} d{e['block_d']} a{e.get('stride_align', 1)}"
        if image.suffix == ".hsaco":
            if readelf is None:
                readelf = (_llvm_tool(build_dir, "llvm-readelf") if build_dir
                           else shutil.which("llvm-readelf") or shutil.which("llvm-readelf-15"))
                if not readelf:
                    raise SystemExit("kernel_resources.py: expected llvm-readelf for hsaco")
            notes = subprocess.run([readelf, "--notes", str(image)], capture_output=True,
                                   text=True, check=True).stdout
            k = parse_amdgpu_notes(notes, e["arch"], e["file"])
            if not k:
                raise SystemExit(f"kernel_resources.py: no AMDGPU metadata in {image}")
            u = k[0]
            rows.append((name, e["arch"], u.registers, str(u.spill_stores), str(u.spill_loads),
                         str(e["shared"]), str(u.stack), str(e["size"])))
        else:
            cuobjdump = cuobjdump or _cuobjdump()
            out = subprocess.run([cuobjdump, "-res-usage", str(image)], capture_output=True,
                                 text=True, check=True).stdout
            m = RE_RES_USAGE.search(out)
            if not m:
                raise SystemExit(f"kernel_resources.py: no resource usage for {image}: {out}")
            reg, stack, _, local = m.groups()
            rows.append((name, e["arch"], reg, local, "-", str(e["shared"]), stack, str(e["size"])))
    head = ("kernel", "arch", "regs", "spill", "spill", "shared B", "stack B", "image B")
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    legend = (
        "# AOTriton images: regs = v/a/s VGPRs/AGPRs/SGPRs (AMD) or registers per thread (CUDA); "
        "spill = VGPRs, SGPRs spilled (AMD) or local-memory bytes (CUDA); shared = dynamic LDS / "
        "shared memory per block; stack = scratch per lane (AMD) or stack frame, where ptxas "
        "spills (CUDA); a16 = compiled for strides % 16 == 0, a1 = any stride"
    )
    total = sum(e["size"] for e in index["kernels"])
    seconds = sum(e["compile_s"] for e in index["kernels"])
    lines = [legend, f"# {len(rows)} images, {total} bytes, compiled in {seconds:.1f} s (summed)"]
    for row in (head, *rows):
        lines.append("  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(row, widths))).rstrip())
    # AMD: spilled VGPRs/SGPRs; CUDA: ptxas puts spilled registers in the stack frame.
    spills = [r for r in rows if r[3] not in ("0", "-") or r[4] not in ("0", "-")
              or (r[4] == "-" and r[6] != "0")]
    lines.append(f"# images with spills (AMD: VGPR/SGPR spills; CUDA: a stack frame): {len(spills)}")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------- table
def demangle(names: list[str]) -> dict[str, str]:
    """Mangled -> readable name without return type, parameter list and our namespaces (c++filt)."""
    if not names or not shutil.which("c++filt"):
        return {n: n for n in names}
    out = subprocess.run(
        ["c++filt"], check=False, input="\n".join(names), capture_output=True, text=True
    ).stdout
    readable = {}
    for name, dem in zip(names, out.splitlines()):
        depth, cut = 0, len(dem)
        for i in range(len(dem) - 1, -1, -1):  # strip the trailing "(params)"
            depth += {")": 1, "(": -1}.get(dem[i], 0)
            if depth == 0 and dem[i] == "(":
                cut = i
                break
        dem = dem[:cut] if dem.endswith(")") else dem
        for noise in ("(anonymous namespace)::", "nvte::gpu::", "nvte::"):  # one namespace: ours
            dem = dem.replace(noise, "")
        readable[name] = dem.removeprefix("void ")
    return readable


def format_table(rows: list[KernelUsage], backend: str) -> str:
    names = demangle(sorted({r.kernel for r in rows}))
    if backend == "cuda":
        head = ("kernel", "arch", "regs", "spill st B", "spill ld B", "smem B", "stack B")
        legend = (
            "CUDA, from ptxas -v: registers per thread, spill stores/loads in bytes, static "
            "shared memory per block, stack frame bytes"
        )
    else:
        head = ("kernel", "arch", "regs", "VGPR spill", "SGPR spill", "LDS B", "scratch B")
        legend = (
            "ROCm, from the code objects' AMDGPU metadata (as -Rpass-analysis="
            "kernel-resource-usage): v/a/s = VGPRs/AGPRs/SGPRs, spilled registers, static "
            "LDS per block, scratch bytes per lane"
        )
    body = [
        (
            names[r.kernel],
            r.arch,
            r.registers,
            str(r.spill_stores),
            str(r.spill_loads),
            str(r.shared),
            str(r.stack),
        )
        for r in sorted(rows, key=lambda r: (names[r.kernel], r.arch))
    ]
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    widths[0] = min(widths[0], 90)
    n_objects = len({r.source for r in rows})
    lines = [f"# {legend}", f"# {len(body)} kernel x arch entries from {n_objects} object files"]
    for row in (head, *body):
        cells = [row[0][: widths[0]].ljust(widths[0])]
        cells += [
            c.rjust(w) if i > 1 else c.ljust(w)
            for i, (c, w) in enumerate(zip(row, widths))
            if i > 0
        ]
        lines.append("  ".join(cells).rstrip())
    spills = [b for b in body if b[3] != "0" or b[4] != "0"]
    lines.append(f"# kernels with spills: {len(spills)}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "capture":
        return capture(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("table", help="collect and print the table")
    t.add_argument("--backend", choices=("cuda", "rocm"), required=True)
    t.add_argument("--build-dir", type=Path, required=True)
    t.add_argument("--out", type=Path, help="also write the table here")
    a = sub.add_parser("aotriton", help="table of AOTriton images (build_tools/aotriton.py)")
    a.add_argument("--index", type=Path, required=True)
    a.add_argument("--build-dir", type=Path, help="a ROCm build (finds its llvm-readelf)")
    a.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "aotriton":
        text = aotriton_table(args.index, args.build_dir.resolve() if args.build_dir else None)
        if args.out:
            args.out.write_text(text)
        sys.stdout.write(text)
        return 0
    build_dir = args.build_dir.resolve()
    rows = cuda_table(build_dir) if args.backend == "cuda" else rocm_table(build_dir)
    if not rows:
        hint = "configure with the capture launcher" if args.backend == "cuda" else "no HIP objects"
        print(
            f"kernel_resources.py: expected kernels in {build_dir}, got none ({hint})",
            file=sys.stderr,
        )
        return 1
    text = format_table(rows, args.backend)
    if args.out:
        args.out.write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
