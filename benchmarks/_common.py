"""Shared by the benchmark scripts (bench_core.py, bench_pytorch.py): cases, interleaved timing,
numerics checks, the results table, the JSON file and the command line.

A script defines CASES = {name: (builder(quick) -> Case, target ratio or None)} and calls `cli`.
ratio = ref_ms / ours_ms (> 1: ours is faster). A case's output is checked against its reference
before it is timed; a mismatch is reported, left out of the JSON and makes the exit status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

# Inductor's cache does not key on ATEN_CPU_CAPABILITY: a graph compiled at one level and loaded at
# another computes garbage or crashes. A capped run gets a cache of its own (read at compile time).
if os.environ.get("ATEN_CPU_CAPABILITY") and not os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    except ImportError:  # a torch that moved it: the same place by hand
        import getpass
        import tempfile

        def default_cache_dir() -> str:
            return os.path.join(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}")

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = (
        f"{default_cache_dir()}_{os.environ['ATEN_CPU_CAPABILITY'].lower()}"
    )


class MissingOp(Exception):
    """Something the case needs on our side (an nvte_* function, an op) is not there (yet)."""


class NotAvailable(Exception):
    """The reference side does not exist in this PyTorch build."""


class TooSlow(Exception):
    """One call of a side takes longer than the per-call limit (--max-call-s): the case is reported
    with the measured (or predicted) seconds per call instead of a ratio, and left out of the JSON.
    E.g. torch._scaled_mm on a CPU where it falls into oneDNN's reference matmul."""


# Bounds on one case's time (set by cli): a side whose single call exceeds MAX_CALL_S is reported
# as too slow; otherwise warmup + repeats are cut so the timed pairs fit in CASE_BUDGET_S.
LIMITS = {"max_call_s": 20.0, "case_budget_s": 60.0}


def check_call_time(what: str, seconds: float, predicted: bool = False) -> None:
    """Raises TooSlow when one call of `what` takes (or is predicted to take) over the limit."""
    if seconds > LIMITS["max_call_s"]:
        kind = "predicted" if predicted else "measured"
        raise TooSlow(f"{what}: {seconds:.1f} s per call ({kind}; limit {LIMITS['max_call_s']:g} s, "
                      "--max-call-s)")


@dataclass
class Case:
    ours: Callable[[], object]
    ref: Callable[[], object]
    check: Callable[[], str | None]  # None when ours agrees with the reference, else why not
    notes: list[str] = field(default_factory=list)
    settle_s: float = 0.0  # untimed pause before each timed call (time_pair_ms)


def time_pair_ms(
    ours: Callable[[], object],
    ref: Callable[[], object],
    warmup: int,
    repeat: int,
    settle_s: float = 0.0,
    notes: list[str] | None = None,
) -> tuple[float, float]:
    """Median ms of each side. The two alternate call by call, so a load change on a shared machine
    hits both alike instead of skewing the ratio. settle_s: a pause before every timed call (both
    sides, untimed), for a side that frees gigabytes per call: on a VM the call after such a free
    runs 1.3-1.5x slower for ~0.2 s, and alternation would always hand that penalty to the other
    side. Bounded: one call of each side is timed first (it is the first warmup call); a side over
    LIMITS["max_call_s"] raises TooSlow, and the remaining warmup and the repeats are cut (to at
    least 3 timed pairs) so the case fits LIMITS["case_budget_s"]; a cut is noted in `notes`."""
    first = []
    for fn, what in ((ours, "ours"), (ref, "reference")):
        t0 = time.perf_counter()
        fn()
        first.append(time.perf_counter() - t0)
        check_call_time(what, first[-1])
    pair_s = sum(first) + 2 * settle_s
    fits = max(3, int(LIMITS["case_budget_s"] / max(pair_s, 1e-9)))
    if fits < repeat + warmup - 1:
        warmup, repeat = 1, min(repeat, fits)
        if notes is not None:
            notes.append(f"repeats cut to {repeat} ({pair_s:.1f} s per pair, budget "
                         f"{LIMITS['case_budget_s']:g} s)")
    for _ in range(warmup - 1):
        ours()
        ref()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeat):
        for fn, acc in ((ours, times[0]), (ref, times[1])):
            if settle_s:
                time.sleep(settle_s)
            t0 = time.perf_counter()
            fn()
            acc.append(time.perf_counter() - t0)
    return statistics.median(times[0]) * 1e3, statistics.median(times[1]) * 1e3


# ------------------------------------------------------------------------------------- checks
def bf16_close(out: torch.Tensor, base: torch.Tensor, ref: torch.Tensor, what: str) -> str | None:
    """flash-attention's rule: |ours - ref| <= 2 |torch low precision - ref| (+ a float floor)."""
    err = (out.double() - ref.double()).abs().max().item()
    err_base = (base.double() - ref.double()).abs().max().item()
    floor = 1e-6 * ref.double().abs().max().item()
    if not err <= 2 * err_base + floor:
        return f"{what}: max err {err:.3g} > 2 x torch's {err_base:.3g}"
    return None


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative error in the Frobenius norm: |out - ref| / |ref|."""
    r = ref.double()
    return ((out.double() - r).norm() / r.norm().clamp_min(1e-30)).item()


def rel_close(
    out: torch.Tensor,
    base: torch.Tensor,
    ref: torch.Tensor,
    what: str,
    factor: float = 1.5,
    slack: float = 1e-3,
) -> str | None:
    """Norm-wise rule for chains of ops and FP8: rel_err(ours) <= factor * rel_err(base) + slack,
    base being the reference implementation's own result at the same precision."""
    err, err_base = rel_err(out, ref), rel_err(base, ref)
    if not err <= factor * err_base + slack:
        return f"{what}: relative error {err:.3g} > {factor:g} x reference's {err_base:.3g} + {slack:g}"
    return None


def bf16_peer_check(ours: dict, base: dict, ref32: dict) -> str | None:
    """Each result of `ours` within 2x the peer's bf16 max error of the fp32 computation
    (flash-attention's rule), and norm-wise within 1.5x (+ 0.1%) of the peer's bf16 relative
    error; `base` / `ref32`: the peer's bf16 and fp32 results by name."""
    msgs = []
    for k, out in ours.items():
        msgs.append(bf16_close(out, base[k], ref32[k], k))
        msgs.append(rel_close(out, base[k], ref32[k], k, factor=1.5, slack=1e-3))
    return first_error(*msgs)


def first_error(*msgs: str | None) -> str | None:
    return next((m for m in msgs if m), None)


# ------------------------------------------------------------------------------------- running
def run_cases(
    cases: dict[str, tuple[Callable[[bool], Case], float | None]],
    names: Sequence[str],
    quick: bool,
    warmup: int,
    repeat: int,
    fatal: tuple[type[BaseException], ...] = (),
    describe: Callable[[BaseException], str] = lambda e: f"ERROR: {e}",
) -> tuple[list[dict], bool]:
    """Checks then times each case. Exceptions in `fatal` are reported with `describe` and fail the
    run; MissingOp / NotAvailable are reported and do not."""
    rows, ok = [], True
    for name in names:
        builder, target = cases[name]
        row = {
            "case": name,
            "ours_ms": None,
            "ref_ms": None,
            "ratio": None,
            "target": target,
            "status": "",
            "notes": [],
        }
        rows.append(row)
        try:
            case = builder(quick)
            problem = case.check()
            row["notes"] = case.notes
            if problem:
                row["status"] = f"NUMERICS MISMATCH: {problem}"
                ok = False
                continue
            row["ours_ms"], row["ref_ms"] = time_pair_ms(case.ours, case.ref, max(warmup, 1),
                                                          repeat, case.settle_s, row["notes"])
            row["ratio"] = row["ref_ms"] / row["ours_ms"]
            if target is None:
                row["status"] = "report only"
            else:
                below = "below target (quick sizes)" if quick else "BELOW TARGET"
                row["status"] = "ok" if row["ratio"] >= target else below
        except MissingOp as e:
            row["status"] = f"missing op: {e}"
        except NotAvailable as e:
            row["status"] = "n/a (reference unavailable)"
            row["notes"].append(f"{e}; omitted from JSON")
        except TooSlow as e:
            row["status"] = f"too slow: {e}"
            row["notes"].append("omitted from JSON")
        except fatal as e:
            row["status"] = describe(e)
            ok = False
        print(f"  {name}: {row['status']}", file=sys.stderr, flush=True)
    return rows, ok


def cpu_level_line() -> str:
    """The CPU level the run used: our kernels' (NVTE_CPU_ISA caps it) and oneDNN's."""
    from transformer_engine_lite.common import build_info

    info = build_info()
    isa = info.get("cpu_isa", {})
    return (
        f"CPU level: ours {isa.get('level')} (detected {isa.get('detected')}, clone "
        f"{isa.get('clone')}), oneDNN {info.get('onednn_isa')}"
    )


def print_table(rows: list[dict]) -> None:
    def f(v, fmt):
        return format("-", ">10") if v is None else format(v, fmt)

    head = f"{'case':34} {'ours ms':>10} {'ref ms':>10} {'ratio':>7} {'target':>7}  status"
    print(head)
    print("-" * len(head))
    for r in rows:
        tgt = "report" if r["target"] is None else f">={r['target']:g}x"
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        print(
            f"{r['case']:34} {f(r['ours_ms'], '10.3f')} {f(r['ref_ms'], '10.3f')} {ratio:>7} "
            f"{tgt:>7}  {r['status']}"
        )
        for note in r["notes"]:
            print(f"{'':34} note: {note}")


def write_json(rows: list[dict], path: str) -> None:
    """{case: {"ours_ms", "ref_ms", "ratio"}} for the cases that were timed."""
    out = {
        r["case"]: {"ours_ms": r["ours_ms"], "ref_ms": r["ref_ms"], "ratio": r["ratio"]}
        for r in rows
        if r["ratio"] is not None
    }
    with open(path, "w") as fh:
        json.dump(out, fh, indent=2)
    print(f"wrote {path} ({len(out)} cases)")


def cli(
    doc: str,
    cases: dict[str, tuple[Callable[[bool], Case], float | None]],
    header: Callable[[], str],
    argv: list[str] | None = None,
    default_repeat: tuple[int, int] = (10, 5),
    fatal: tuple[type[BaseException], ...] = (),
    describe: Callable[[BaseException], str] = lambda e: f"ERROR: {e}",
) -> int:
    """The shared command line: --cases, --list, --quick, --json, --warmup, --repeat, --strict.
    default_repeat: (full, quick). header() is printed after the thread setup."""
    p = argparse.ArgumentParser(
        description=doc.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--cases",
        default="all",
        help="comma-separated case names, or 'all' (default); --list shows them",
    )
    p.add_argument("--list", action="store_true", help="list the cases and exit")
    p.add_argument(
        "--quick",
        action="store_true",
        help="small sizes, for a smoke test (targets are for full sizes)",
    )
    p.add_argument("--json", metavar="PATH", help='write {case: {"ours_ms", "ref_ms", "ratio"}}')
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument(
        "--repeat",
        type=int,
        default=None,
        help=f"timed runs (default {default_repeat[0]}, quick {default_repeat[1]})",
    )
    p.add_argument("--strict", action="store_true", help="exit 1 when a case misses its target")
    p.add_argument("--max-call-s", type=float, default=LIMITS["max_call_s"],
                   help="a side whose one call takes longer is reported as too slow, not timed "
                        f"(default {LIMITS['max_call_s']:g})")
    p.add_argument("--case-budget-s", type=float, default=LIMITS["case_budget_s"],
                   help="repeats are cut so one case's timed calls fit this many seconds "
                        f"(default {LIMITS['case_budget_s']:g})")
    args = p.parse_args(argv)
    LIMITS.update(max_call_s=args.max_call_s, case_budget_s=args.case_budget_s)

    if args.list:
        for name, (_, target) in cases.items():
            print(f"{name:34} target {'report only' if target is None else f'>= {target:g}x'}")
        return 0
    names = list(cases) if args.cases == "all" else [c.strip() for c in args.cases.split(",") if c]
    unknown = [n for n in names if n not in cases]
    if unknown:
        p.error(f"unknown case(s) {unknown}; expected some of {list(cases)}")
    repeat = args.repeat or default_repeat[1 if args.quick else 0]

    torch.set_num_threads(os.cpu_count() or 1)
    print(
        f"{header()}; {'quick' if args.quick else 'full'} sizes, median of {repeat} after "
        f"{args.warmup} warmup"
    )
    print(cpu_level_line())
    rows, ok = run_cases(cases, names, args.quick, args.warmup, repeat, fatal, describe)
    print_table(rows)
    if args.json:
        write_json(rows, args.json)
    if not ok:
        return 1
    if args.strict and any(r["status"] == "BELOW TARGET" for r in rows):
        return 1
    return 0


def fwd_bwd_step(fn: Callable, params: list, x: Any, dy: Any) -> Callable[[], Any]:
    """One timed training call: gradients reset to None, y = fn(x), y.backward(dy); returns y."""

    def step() -> Any:
        for p in params:
            p.grad = None
        x.grad = None
        y = fn(x)
        y.backward(dy)
        return y

    return step
