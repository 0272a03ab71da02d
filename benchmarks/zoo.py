"""The torchvision classification zoo at its usual input size: PTQ export status and ONNX
Runtime INT8 / FP32 speed.

Each model (random weights: speed does not depend on them, see ``trtqat.stages.zoo``) goes through
max calibration, the checked INT8 export, the Q/DQ lint and an ORT engine (``trtqat.stages.zoo.
run_ptq``); its FP32 export is built too. The INT8 and FP32 engines are then timed in
interleaved rotated rounds (``trtqat.stages.compare.timing``): each figure is the median over
rounds, with its spread ``(max - min) / median``; a spread above 10% is flagged ``!``.

A model that fails is recorded with the failed stage and error; the sweep goes on. Results
go to ``<out>/results.json`` and ``results.md``. Example:
``python benchmarks/zoo.py --models mobilenet_v2,shufflenet_v2_x1_0 --duration 3``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trtqat.stages.compare.report import UNSTABLE_SPREAD, VariantResult  # noqa: E402
from trtqat.stages.compare.timing import Timed, time_interleaved  # noqa: E402
from trtqat.stages.zoo import (  # noqa: E402
    USUAL_SIZE,
    ZOO,
    ZooResult,
    format_results,
    quantized_model,
    run_ptq,
)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(ZOO.values()),
                   help="comma-separated torchvision names (default: one per family)")
    p.add_argument("--size", type=int, default=None, help=f"input size (default: {USUAL_SIZE})")
    p.add_argument("--batch", type=int, default=1, help="timed batch size")
    p.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads")
    p.add_argument("--duration", type=float, default=3.0, help="s per engine, over all rounds")
    p.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds")
    p.add_argument("--warmup", type=float, default=200.0, help="ms before each round")
    p.add_argument("--out", default="runs/zoo", help="results folder")
    args = p.parse_args(argv)
    if args.batch < 1 or args.threads < 1 or args.rounds < 1 or not args.duration > 0:
        p.error("--batch, --threads, --rounds must be >= 1 and --duration > 0")
    return args


def _fp32_engine(model: torch.nn.Module, name: str, size: int, out: Path, threads: int):
    from trtqat.engines import build_engine
    from trtqat.export import export_onnx
    from trtqat.stages.zoo import synthetic_batches
    from trtqat.variants import artifact_name

    path = out / artifact_name(f"{name}_{size}", "", "fp32")
    export_onnx(model, synthetic_batches(1, 2, size, 2)[0], path, "fp32")
    return build_engine(path, "ort", threads=threads)


def _figure(res: VariantResult, batch: int) -> str:
    lat, sp = res.latency_ms.get(batch), res.latency_spread.get(batch)
    if lat is None:
        return "-"
    return f"{lat:.2f} ms ±{sp:.0%}" + (" !" if sp > UNSTABLE_SPREAD else "")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the sweep; exit 1 if any model failed."""
    args = _parse(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    rows: list[tuple[ZooResult, VariantResult, VariantResult]] = []
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        size = args.size or USUAL_SIZE
        print(f"{name} at {size} px: calibrate, export, lint, engine ...", flush=True)
        model = quantized_model(name)
        result = run_ptq(name, size, out, model=model, engine_threads=args.threads)
        int8, fp32 = VariantResult(name, "int8"), VariantResult(name, "fp32")
        if result.status == "ok":
            from trtqat.stages.zoo import synthetic_batches

            feed = {args.batch: {"input": synthetic_batches(1, args.batch, size, 9)[0].numpy()}}
            fp32_engine = _fp32_engine(model, name, size, out, args.threads)
            kw = {"threads": args.threads}
            time_interleaved([Timed(int8, result.engine, kw, feed),
                              Timed(fp32, fp32_engine, kw, feed)], [args.batch],
                             args.duration, args.warmup, rounds=args.rounds,
                             echo=lambda _: None)
        rows.append((result, int8, fp32))
        print(format_results([result], lambda r, a=int8, b=fp32: (
            f"INT8 {_figure(a, args.batch)}  FP32 {_figure(b, args.batch)}  ")), flush=True)
    md = ["| model | px | status | INT8 latency | FP32 latency | notes / error |",
          "|---|---|---|---|---|---|"]
    for r, a, b in rows:
        md.append(f"| {r.name} | {r.image_size} | {r.status}{' (' + r.stage + ')' if r.stage else ''}"
                  f" | {_figure(a, args.batch)} | {_figure(b, args.batch)} | "
                  f"{r.error or '; '.join(r.notes)} |")
    md += ["", f"ORT CPU, batch {args.batch}, {args.threads} threads; median over "
           f"{args.rounds} interleaved rounds ±(max - min) / median; ! = spread > "
           f"{UNSTABLE_SPREAD:.0%}. Random weights; max calibration on synthetic images."]
    (out / "results.md").write_text("\n".join(md) + "\n")
    (out / "results.json").write_text(json.dumps(
        {"settings": vars(args), "models": [
            r.to_json() | {"int8": a.to_json(), "fp32": b.to_json()} for r, a, b in rows]},
        indent=2, default=str))
    print("\n".join(md))
    return 1 if any(r.status != "ok" for r, _, _ in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
