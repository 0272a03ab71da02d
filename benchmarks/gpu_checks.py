"""Every GPU check of the QAT-step work (issue 35) as one prepared, time-boxed run.

A lent GPU comes with minutes, not hours: this script runs the checks in order of value,
each in its own process with its own log, starts a check only while the time left covers
its estimate, kills one that overruns, and writes ``summary.md`` / ``summary.json`` (what
ran, exit codes, seconds, the log of each) into ``--out``. The checks:

* ``env``       torch / Triton / GPU versions and ``nvidia-smi``
* ``tests``     the test files with CUDA-only tests (real Triton kernels, CUDA-graph steps,
                the pytorch-quantization drop-in and the accelerated paths on the GPU)
* ``lean``      ``lean_backward_cuda.py``: lean vs plain gradients bit for bit on the real
                kernels, then the step memory and time of FP32 / plain / lean (ResNet50)
* ``eager``     ``qat_overhead.py --device cuda --models resnet50 --amp bf16``: every
                library, GPU busy time, step memory and the ``trtqat graphs`` row
* ``compiled``  the same with ``--compile``
* ``repeat``    the eager comparison in 3 fresh processes (``--repeat-process 3``)
* ``format``    ``format_qat_step.py`` (INT8 / FP8 QAT step, ResNet50)

On a device machine without network, run from the repository root (the device's own torch,
torchvision and Triton are used; nothing is installed; ``TRTQAT_JIT=0`` unless set, so the
CPU kernel is not compiled on first use there)::

    python benchmarks/gpu_checks.py --only env,tests,lean,eager --budget 540 --out "$OUT"
    python benchmarks/gpu_checks.py --only compiled,repeat,format --budget 540 --out "$OUT"

``--device cpu`` runs the same checks at toy sizes on the CPU (a smoke test of the script:
checks without a CPU form are skipped). Exit code 0 when every selected check ran and passed,
1 when one failed or overran, 2 when one was skipped (time, device or a missing module).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CUDA_TEST_FILES = (
    "tests/quant/test_triton_kernels.py",
    "tests/runs/test_graphed_step.py",
    "tests/stages/test_accel.py",
    "tests/families/encoder/test_accel.py",
    "tests/quant/test_pq_compat_quantizer.py",
)
_ENV = ("import platform, torch, torchvision; print('python', platform.python_version()); "
        "print('torch', torch.__version__, 'cuda', torch.version.cuda, 'torchvision', "
        "torchvision.__version__); import importlib.util as u; "
        "print('triton', __import__('triton').__version__ if u.find_spec('triton') else None); "
        "print('gpu', torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)")


@dataclasses.dataclass
class Check:
    """One check: its command on each device (None: no form there), its time estimate and
    limit in seconds, and the module it needs beyond torch."""

    name: str
    cuda: list[str] | None
    cpu: list[str] | None
    estimate_s: int
    limit_s: int
    needs: str | None = None


def _checks(out: Path) -> list[Check]:
    py, bench = sys.executable, "benchmarks/"
    resnet = ["--models", "resnet50", "--amp", "bf16", "--no-calib"]
    toy = ["--models", "resnet18", "--batch", "2", "--size", "32", "--steps", "2", "--warmup",
           "1", "--no-peers", "--no-calib"]

    def overhead(name: str, *extra: str) -> tuple[list[str], list[str]]:
        base = [py, bench + "qat_overhead.py", "--json-out", str(out / f"{name}.json")]
        return base + ["--device", "cuda", *resnet, *extra], base + toy + list(extra)

    pytest = [py, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-p", "no:xdist",
              *CUDA_TEST_FILES]
    eager, compiled, repeat = (overhead("eager"), overhead("compiled", "--compile"),
                               overhead("repeat", "--repeat-process", "3"))
    return [
        Check("env", [py, "-c", _ENV], [py, "-c", _ENV], 10, 60),
        Check("tests", pytest, pytest + ["-m", "not slow", "-x"], 120, 300, needs="pytest"),
        Check("lean", [py, bench + "lean_backward_cuda.py"],
              [py, bench + "lean_backward_cuda.py", "--device", "cpu", "--model", "resnet18",
               "--batch", "2", "--size", "32", "--steps", "2", "--amp", "none"], 120, 300),
        Check("eager", *eager, 150, 400),
        Check("compiled", *compiled, 300, 540),
        Check("repeat", *repeat, 300, 540),
        Check("format", [py, bench + "format_qat_step.py", "--device", "cuda", "--model",
                         "resnet50", "--batch", "128", "--size", "224"], None, 120, 300),
    ]


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="checks: env, tests, lean, eager, compiled, repeat, format")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="cuda (default) or cpu: the same checks at toy sizes, a smoke test")
    p.add_argument("--only", default=None,
                   help="comma-separated checks to run, in the script's order (default: all)")
    p.add_argument("--budget", type=float, default=540.0,
                   help="seconds for the whole run; a check starts only when the time left "
                        "covers its estimate (default 540: one 10-minute device command)")
    p.add_argument("--out", default=None,
                   help="folder for the logs and summary (default: $OUT when set, else "
                        "engines/gpu_checks-<time>)")
    args = p.parse_args(argv)
    if args.budget <= 0:
        p.error(f"--budget must be > 0 seconds, got {args.budget}")
    names = [c.name for c in _checks(Path("."))]
    if args.only is not None:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in names]
        if unknown or not wanted:
            p.error(f"--only: unknown check(s) {', '.join(unknown) or '(none given)'}; "
                    f"choose from {', '.join(names)}")
        args.only = set(wanted)
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            p.error(f"--device cuda: torch {torch.__version__} sees no CUDA GPU here; run on "
                    "a GPU machine, or use --device cpu for a smoke test of the script")
    if args.out is None:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        args.out = os.environ.get("OUT") or str(ROOT / "engines" / f"gpu_checks-{stamp}")
    return args


def _run(argv: list[str], log: Path, limit_s: float, env: dict) -> tuple[int | None, float]:
    """Run one check in its own process group, output to ``log``; (exit code or None when
    it overran and was killed, seconds)."""
    t0 = time.monotonic()
    with log.open("w") as f:
        f.write("$ " + " ".join(argv) + "\n")
        f.flush()
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        try:
            rc: int | None = proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = None
            f.write(f"\n[gpu_checks] killed after {limit_s:.0f} s (its limit or the budget)\n")
    return rc, time.monotonic() - t0


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _summary(rows: list[dict], args: argparse.Namespace) -> str:
    lines = [f"# gpu_checks ({args.device}, budget {args.budget:.0f} s)", "",
             "| check | result | seconds | log |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['check']} | {r['result']} | {r['seconds']:.0f} | {r['log'] or ''} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    if args.device == "cuda":
        # the CPU kernel is not what these checks measure: no minute-long first-use compile
        env.setdefault("TRTQAT_JIT", "0")
    deadline = time.monotonic() + args.budget
    rows: list[dict] = []
    for check in _checks(out):
        if args.only is not None and check.name not in args.only:
            continue
        argv = check.cuda if args.device == "cuda" else check.cpu
        left = deadline - time.monotonic()
        row = {"check": check.name, "seconds": 0.0, "log": None, "rc": None}
        if argv is None:
            row["result"] = f"skipped: no {args.device} form"
        elif check.needs and importlib.util.find_spec(check.needs) is None:
            row["result"] = f"skipped: {check.needs} is not installed"
        elif left < check.estimate_s:
            row["result"] = f"skipped: {left:.0f} s left, it needs about {check.estimate_s} s"
        else:
            log = out / f"{check.name}.log"
            print(f"[gpu_checks] {check.name} ...", flush=True)
            rc, seconds = _run(argv, log, min(check.limit_s, left), env)
            row.update(rc=rc, seconds=seconds, log=log.name,
                       result="passed" if rc == 0 else
                       ("overran, killed" if rc is None else f"failed (exit {rc})"))
        print(f"[gpu_checks] {check.name}: {row['result']}", flush=True)
        rows.append(row)
        _write(out / "summary.json", json.dumps(rows, indent=2) + "\n")
        _write(out / "summary.md", _summary(rows, args))
    print(_summary(rows, args), end="")
    if any(r["result"] != "passed" and not r["result"].startswith("skipped") for r in rows):
        return 1
    return 2 if any(r["result"].startswith("skipped") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
