"""``qat_overhead.py --repeat-process N``: the whole comparison N times, each in a fresh
Python process (its own allocator, caches, kernel choices and clock states), then the median
over processes of each variant's per-process medians, and whether the ordering of the
variants (fastest to slowest) held in every process.

Each child runs ``qat_overhead.py`` with the same options plus ``--json-out FILE --no-calib``
and writes its table rows there; this module only starts the children and summarises.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

SCRIPT = Path(__file__).with_name("qat_overhead.py")
FIELDS = ("ms", "ratio", "cpu_ms", "cpu_ratio", "gpu_ms")


def strip_option(argv: Sequence[str], name: str) -> list[str]:
    """``argv`` without ``name VALUE`` / ``name=VALUE`` (every occurrence)."""
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a == name:
            skip = True
        elif not a.startswith(name + "="):
            out.append(a)
    return out


def run_children(argv: Sequence[str], n: int, log: Callable[[str], None]) -> list[list[dict]]:
    """The table rows of ``n`` child processes of ``qat_overhead.py argv``, in order."""
    runs: list[list[dict]] = []
    for i in range(n):
        with tempfile.TemporaryDirectory(prefix="qat_overhead_") as tmp:
            out = Path(tmp) / "rows.json"
            cmd = [sys.executable, str(SCRIPT), *argv, "--no-calib", "--json-out", str(out)]
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0 or not out.exists():
                tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
                raise SystemExit(f"process {i + 1}/{n} failed (exit {proc.returncode}): {tail}")
            runs.append(json.loads(out.read_text()))
        log(f"  process {i + 1}/{n} done in {time.perf_counter() - t0:.0f} s")
    return runs


def _ordering(rows: list[dict], model: str) -> list[str]:
    timed = [r for r in rows if r.get("model") == model and "variant" in r]
    return [r["variant"] for r in sorted(timed, key=lambda r: r["ms"])]


def summarize(runs: list[list[dict]]) -> dict:
    """Per (model, variant) found in every run: the median of each field over the runs and
    the per-run values; per model: each run's ordering and whether all agree."""
    first = runs[0]
    rows = []
    for r in first:
        if "variant" not in r:
            continue
        key = (r["model"], r["variant"])
        same = [next((x for x in run if (x.get("model"), x.get("variant")) == key), None)
                for run in runs]
        if any(x is None for x in same):
            continue
        row = {"model": key[0], "variant": key[1], "processes": len(runs)}
        for f in FIELDS:
            vals = [x[f] for x in same if x.get(f) is not None]
            if vals:
                row[f] = statistics.median(vals)
                row[f + "_each"] = vals
        rows.append(row)
    orderings = {}
    for model in dict.fromkeys(r["model"] for r in rows):
        each = [_ordering(run, model) for run in runs]
        orderings[model] = {"each": each, "held": all(o == each[0] for o in each)}
    return {"rows": rows, "orderings": orderings}


def print_summary(summary: dict, cuda: bool) -> None:
    """The median-of-medians table and the ordering verdicts."""
    n = summary["rows"][0]["processes"] if summary["rows"] else 0
    gpu = f"{'gpu ms':>8} " if cuda else ""
    print(f"\nmedian over {n} fresh processes of each variant's per-process median:")
    print(f"{'model':<10} {'variant':<30} {'wall ms':>9} {'x FP32':>7} {'cpu ms':>9} "
          f"{'x FP32':>7} {gpu} x FP32 in each process")
    for r in summary["rows"]:
        g = f"{r['gpu_ms']:8.1f} " if cuda and "gpu_ms" in r else (f"{'-':>8} " if cuda else "")
        each = ", ".join(f"{v:.3f}" for v in r.get("ratio_each", []))
        print(f"{r['model']:<10} {r['variant']:<30} {r['ms']:9.1f} {r['ratio']:7.3f} "
              f"{r['cpu_ms']:9.1f} {r['cpu_ratio']:7.3f} {g} {each}")
    for model, o in summary["orderings"].items():
        verdict = "held in every process" if o["held"] else "did NOT hold in every process"
        print(f"{model}: ordering (fastest first) {' < '.join(o['each'][0])}: {verdict}")
        if not o["held"]:
            for i, each in enumerate(o["each"], 1):
                print(f"  process {i}: {' < '.join(each)}")


def main(argv: Sequence[str], n: int, cuda: bool, log: Callable[[str], None]) -> dict:
    """Run the comparison in ``n`` fresh processes; print and return the summary."""
    child = strip_option(strip_option(argv, "--repeat-process"), "--json-out")
    log(f"running the comparison in {n} fresh processes ...")
    summary = summarize(run_children(child, n, log))
    print_summary(summary, cuda)
    return summary
