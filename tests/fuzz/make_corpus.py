#!/usr/bin/env python3
"""Regenerates the committed seed corpus of the fuzz harnesses (tests/fuzz/corpus/<harness>/).

For each harness built by ci/fuzz.sh (build/fuzz/harnesses/fuzz_*): libFuzzer runs a fixed number of
executions (-seed=1 -runs=N, so the result depends only on the build) from the current corpus into
a scratch folder; every input found is then replayed once with NVTE_FUZZ_STATS=2, and for each op
`--keep` inputs (at most --max-len bytes; more when the harness has few ops, ~12 per harness),
spread over the lengths of those that made the op succeed, are written as
tests/fuzz/corpus/<harness>/<op>-<i>. Seeds therefore start the timed CI runs from valid calls of
every op. regressions/ (inputs of fixed findings, always replayed) is left as it is.

    bash ci/fuzz.sh                       # builds build/fuzz (NVTE_FUZZ_SECONDS=0: build + replay)
    python3 tests/fuzz/make_corpus.py     # then commit tests/fuzz/corpus
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def op_successes(exe: Path, files: list[Path]) -> dict[Path, set[str]]:
    """Runs every file once in one process (NVTE_FUZZ_STATS=2): the ops each made succeed."""
    env = dict(os.environ, NVTE_FUZZ_STATS="2", OMP_NUM_THREADS="1")
    out = subprocess.run([str(exe), *map(str, files)], env=env, capture_output=True, text=True,
                         check=True)
    ok: dict[Path, set[str]] = {f: set() for f in files}
    current = None
    for line in out.stderr.splitlines():
        if line.startswith("Running: "):
            current = Path(line[len("Running: "):].strip())
        elif line.startswith("fuzz-call ") and current is not None:
            _, op, status = line.split()
            if status == "0":
                ok[current].add(op)
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", type=Path, default=ROOT / "build/fuzz/harnesses")
    ap.add_argument("--runs", type=int, default=100000, help="libFuzzer executions per harness")
    ap.add_argument("--keep", type=int, default=2, help="inputs kept per op")
    ap.add_argument("--max-len", type=int, default=96, help="longest input kept (bytes)")
    ap.add_argument("harness", nargs="*", help="harness names (default: every fuzz_*.cpp)")
    args = ap.parse_args()
    names = args.harness or sorted(p.stem for p in (ROOT / "tests/fuzz").glob("fuzz_*.cpp"))
    for name in names:
        exe = args.build / name
        if not exe.exists():
            print(f"make_corpus: {exe} not built (run ci/fuzz.sh first)", file=sys.stderr)
            return 1
        dest = ROOT / "tests/fuzz/corpus" / name
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp) / "corpus"
            work.mkdir()
            if dest.exists():
                for f in dest.iterdir():
                    if f.is_file():
                        shutil.copy(f, work / f.name)
            subprocess.run([str(exe), str(work), "-seed=1", f"-runs={args.runs}", "-timeout=10",
                            f"-max_len={args.max_len}", f"-artifact_prefix={tmp}/"],
                           env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, check=True)
            best: dict[str, list[tuple[int, bytes]]] = {}
            files = [f for f in sorted(work.iterdir()) if f.stat().st_size <= args.max_len]
            for f, ops in op_successes(exe, files).items():
                data = f.read_bytes()
                for op in ops:
                    best.setdefault(op, []).append((len(data), data))
            for f in dest.glob("*") if dest.exists() else []:
                if f.is_file():
                    f.unlink()
            dest.mkdir(parents=True, exist_ok=True)
            if name != "fuzz_tensor":  # handle setup succeeds in every harness: not an op of its own
                for op in ("nvte_set_tensor_param", "nvte_set_tensor_device"):
                    best.pop(op, None)
            # At least ~12 seeds per harness; per op, evenly spread over the lengths of the inputs
            # that made it succeed (longer inputs make more of the decoding choices).
            keep = max(args.keep, -(-12 // max(len(best), 1)))
            kept = 0
            seen: set[bytes] = set()
            for op, items in sorted(best.items()):
                items = sorted(set(items), key=lambda x: (-x[0], x[1]))
                picks = [items[(len(items) - 1) * j // max(keep - 1, 1)] for j in range(keep)]
                i = 0
                for _, data in picks:
                    if data in seen:
                        continue
                    seen.add(data)
                    (dest / f"{op.removeprefix('nvte_')}-{i}").write_bytes(data)
                    i += 1
                    kept += 1
            print(f"{name}: {kept} seeds for {len(best)} ops")
    return 0


if __name__ == "__main__":
    sys.exit(main())
