"""Times the full `trtqat demo` (fresh, in a temporary folder) against its 10-minute target.

    python benchmarks/demo_time.py [--keep DIR] [extra trtqat demo options]
    python benchmarks/demo_time.py --model mobilenet_v2      # one model of the demo

Prints the wall time of each stage of each model (from the demo's own progress lines), each
model's total and the whole run's. The 10-minute target is per model (`trtqat demo --model
NAME`); `trtqat demo` without --model runs every demo model one after the other. The demo's
CPU time (user + system, its own and its children's) is printed beside the wall time: on a
machine shared with other jobs the wall time overstates what the demo needs.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_S = 600.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", default=None, help="run in this folder and keep it")
    args, extra = parser.parse_known_args(argv)
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="trtqat-demo-"))
    cmd = [sys.executable, "-m", "trtqat", "demo", "--fresh", "--no-progress",
           "--runs", str(root / "runs"), "--export-dir", str(root / "export"),
           "--out", str(root / "engines"), *extra]
    print("running:", " ".join(cmd), flush=True)
    start = time.perf_counter()
    stages: list[tuple[str, float]] = []
    model = ""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        print(line, end="", flush=True)
        header = re.match(r"=== (\S+) \(\d+/\d+\) ===", line)
        if header:
            model = header.group(1)
            stages.append((f"{model}: start", time.perf_counter() - start))
        m = re.match(r"\[(\d)/4\] (.*)", line)
        if m:
            stages.append((f"{model}: {m.group(2).split(':')[0]}"[:60],
                           time.perf_counter() - start))
        if line.startswith("demo report:"):
            stages.append(("demo report", time.perf_counter() - start))
    code = proc.wait()
    total = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = usage.ru_utime + usage.ru_stime
    print("\n=== demo timing ===")
    models: dict[str, float] = {}
    for i, (name, t0) in enumerate(stages):
        t1 = stages[i + 1][1] if i + 1 < len(stages) else total
        if name.endswith(": start"):
            continue
        print(f"{name:<60s} {t1 - t0:7.1f} s")
        owner = name.split(":")[0] if ":" in name else ""
        if owner:
            models[owner] = models.get(owner, 0.0) + t1 - t0
    ok = all(t <= TARGET_S for t in models.values()) if models else total <= TARGET_S
    for owner, t in models.items():
        verdict = "within" if t <= TARGET_S else "OVER"
        print(f"{owner + ' total':<60s} {t:7.1f} s  ({verdict} the {TARGET_S:.0f} s target)")
    print(f"{'total':<60s} {total:7.1f} s  (exit {code})")
    print(f"{'CPU time (user + system)':<60s} {cpu:7.1f} s  (load average now "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
    return code or (0 if ok else 1)


if __name__ == "__main__":
    sys.exit(main())
