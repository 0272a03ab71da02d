"""Times the full `trtqat demo` (fresh, in a temporary folder) against its 10-minute target.

    python benchmarks/demo_time.py [--keep DIR] [extra trtqat demo options]

Prints the wall time of each stage (from the demo's own progress lines) and the total.
"""

from __future__ import annotations

import argparse
import re
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
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        print(line, end="", flush=True)
        m = re.match(r"\[(\d)/4\] (.*)", line)
        if m:
            stages.append((m.group(2).split(":")[0], time.perf_counter() - start))
    code = proc.wait()
    total = time.perf_counter() - start
    print("\n=== demo timing ===")
    for i, (name, t0) in enumerate(stages):
        t1 = stages[i + 1][1] if i + 1 < len(stages) else total
        print(f"{name:<45s} {t1 - t0:7.1f} s")
    verdict = "within" if total <= TARGET_S else "OVER"
    print(f"{'total':<45s} {total:7.1f} s  ({verdict} the {TARGET_S:.0f} s target; exit {code})")
    return code


if __name__ == "__main__":
    sys.exit(main())
