"""FP8 E4M3 export fidelity (issue 36): ResNet18, MobileNetV2, a ViT and MiniLM exported
as ``fp8`` (and ``fp8-fp16``), checked in ONNX Runtime on the CPU against PyTorch's
fake-FP8 model, and linted for TensorRT.

Each model is quantized with ``{"format": "fp8"}`` (max calibration), exported through
:class:`trtqat.export.Exporter` with its validation data, and the figures are printed as
measured: ORT-vs-PyTorch top-1 agreement (classifiers; target >= 99%), embedding cosine
(MiniLM; target >= 0.999 mean), lint errors and warnings (target: no error), and the file
sizes of both weight forms (``compressed``: FP8 initializers; ``qdq``: float weights).
The CNNs and the ViT are trained from scratch on scikit-learn's digits for
``--epochs`` epochs (0: random weights, BatchNorm settled, random images; such models have
tiny logit margins, so their top-1 agreement measures chaos more than the export), then
checked on the 360 validation digits: the figure is the export's fidelity, not accuracy.

    python benchmarks/fp8_export.py [--models resnet18,mobilenet_v2,vit,minilm] [--json f]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from torch import nn  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import trtqat  # noqa: E402
from trtqat.quant.format_apply import to_fp8  # noqa: E402

MODELS = ("resnet18", "mobilenet_v2", "vit", "minilm")


def _images(n: int, size: int, batch: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, 3, size, size, generator=g) for _ in range(n)]


def _settle_batchnorm(model: nn.Module, data: list[torch.Tensor]) -> None:
    """BatchNorm statistics of ``data`` (a random-weight model's activations stay scaled)."""
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.reset_running_stats()
            m.momentum = None
    model.train()
    with torch.no_grad():
        for x in data:
            model(x)
    model.eval()


def _digits(size: int) -> tuple[list[tuple], list[torch.Tensor]]:
    """(train batches (images, labels), validation image batches) of the digits."""
    from trtqat.families.cnn.data import make_loaders

    train, val, _ = make_loaders("digits", size, batch_size=64)
    return list(train), [x for x, _ in val]


def _fit(model: nn.Module, data: list[tuple], epochs: int) -> nn.Module:
    """A few epochs of AdamW on ``data`` (enough for large logit margins on digits)."""
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.05)
    model.train()
    for _ in range(epochs):
        for x, y in data:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    return model.eval()


VIT_ARCH = ["vit"]  # the ViT family's model (--vit-arch)


def _float_model(name: str, size: int) -> nn.Module:
    torch.manual_seed(0)
    if name == "vit":
        from trtqat import families

        return families.get("vit").build(VIT_ARCH[0], 10, image_size=size)
    import torchvision

    return getattr(torchvision.models, name)(num_classes=10)


def _image_model(name: str, size: int, epochs: int) -> tuple[nn.Module, list]:
    """The FP8 model (max calibration on training images) and the validation batches."""
    model = _float_model(name, size)
    if epochs:
        train, val = _digits(size)
        calib = [x for x, _ in train[:4]]
        _fit(model, train, epochs)
    else:
        calib, val = _images(4, size, 32, seed=1), _images(8, size, 32, seed=2)
        _settle_batchnorm(model, _images(4, size, 32, seed=0))
    if name == "vit":
        from trtqat import families

        model = families.get("vit").quantize(model.eval()).eval()
        to_fp8(model)
        trtqat.collect_stats(model, calib, progress=False)
        trtqat.compute_amax(model, "max")
        return model, val
    return trtqat.quantize(model.eval(), {"format": "fp8"}, forward_loop=calib), val


def _file_size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _row(result, path_qdq: Path | None) -> dict:
    checks = {c.name: c for c in result.checks}
    top1 = next((c for n, c in checks.items() if n.startswith("top-1")), None)
    cosine = next((c for n, c in checks.items() if n.startswith("output '")), None)
    lint = result.lint
    return {"variant": result.variant, "passed": result.passed, "opset": result.opset,
            "top1": top1.detail.split(":")[0] if top1 else None,
            "output_check": cosine.detail if cosine else None,
            "lint_errors": len(lint.errors) if lint else None,
            "lint_warnings": len(lint.warnings) if lint else None,
            "lint_rules": sorted(lint.rules()) if lint else [],
            "bytes": _file_size(Path(result.path)),
            "bytes_qdq": _file_size(path_qdq) if path_qdq else None,
            "failed": [c.line() for c in result.checks if not c.passed]}


def _export_all(exporter, out: Path, name: str) -> list[dict]:
    from trtqat.export import ValidationError

    rows = []
    for variant in ("fp8", "fp8-fp16"):
        qdq = None
        if variant == "fp8":
            qdq = out / f"{name}-fp8-qdq.onnx"
            exporter.export(qdq, variant, validate=False, fp8_weights="qdq")
        try:
            result = exporter.export(out / f"{name}-{variant}.onnx", variant)
        except ValidationError as exc:
            result = exc.result
        rows.append(_row(result, qdq))
    return rows


def run_image(name: str, size: int, out: Path, epochs: int) -> list[dict]:
    from trtqat.export import Exporter

    model, val = _image_model(name, size, epochs)
    exporter = Exporter(model, val[0][:2], validation_data=val)
    return _export_all(exporter, out, name)


def run_minilm(out: Path, sentences: int) -> list[dict]:
    from trtqat.families.encoder.corpus import load_corpus
    from trtqat.families.encoder.minilm import load_encoder
    from trtqat.families.encoder.onnx_export import EncoderExporter
    from trtqat.families.encoder.recipes import collect_encoder_stats, quantized_copy, set_amax

    corpus = load_corpus("builtin", heldout=sentences, max_heldout=sentences, seed=0)
    fp32, tok = load_encoder("minilm")
    q = quantized_copy(fp32)
    to_fp8(q)
    collect_encoder_stats(q, tok, corpus.train[:256], batch_size=32, max_length=64)
    set_amax(q, "max")
    half = max(1, sentences // 2)  # every held-out sentence, at two sequence lengths
    exporter = EncoderExporter(copy.deepcopy(q).eval(), tok, sentences=corpus.heldout,
                               shapes=((half, 48), (sentences - half or 1, 24)))
    return _export_all(exporter, out, "minilm")


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--size", type=int, default=32, help="CNN image size")
    p.add_argument("--vit-size", type=int, default=32)
    p.add_argument("--vit-arch", default="vit", help="the ViT family's model: vit (= "
                   "vit_small), vit_tiny, ...")
    p.add_argument("--epochs", type=int, default=3, help="digits training epochs (0: random)")
    p.add_argument("--sentences", type=int, default=64, help="MiniLM validation sentences")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    VIT_ARCH[0] = args.vit_arch
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        for name in args.models.split(","):
            start = time.perf_counter()
            rows = (run_minilm(out, args.sentences) if name == "minilm" else
                    run_image(name, args.vit_size if name == "vit" else args.size, out,
                              args.epochs))
            results[name] = rows
            for r in rows:
                size = f"{r['bytes'] / 1e6:.2f} MB"
                if r["bytes_qdq"]:
                    size += f" (qdq weights: {r['bytes_qdq'] / 1e6:.2f} MB)"
                fidelity = r["top1"] or r["output_check"]
                print(f"{name:13s} {r['variant']:9s} {'PASS' if r['passed'] else 'FAIL'} "
                      f"opset {r['opset']}; {fidelity}; lint {r['lint_errors']} error(s), "
                      f"{r['lint_warnings']} warning(s) {r['lint_rules']}; {size}")
                for line in r["failed"]:
                    print(f"    {line}")
            print(f"  ({time.perf_counter() - start:.0f} s)", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
