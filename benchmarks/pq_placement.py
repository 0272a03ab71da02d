"""Issue 24: a pytorch-quantization-style model (``quant_modules.initialize()`` -> the
torchvision model -> ``trtqat.quantize`` -> ``trtqat.export_onnx``) gets the Q/DQ placement
of the CLI (``trtqat calibrate --model NAME``, which builds the model with
``trtqat.families.cnn.models.build_model``, then ``trtqat export``).

Both are calibrated (max) on the same synthetic batches and exported INT8; the script
compares the QuantizeLinear / DequantizeLinear counts and, for every activation
DequantizeLinear, which node input it feeds (node name, op, input index). Example::

    python benchmarks/pq_placement.py --model resnet50 --size 32
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import onnx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import trtqat  # noqa: E402
from trtqat.stages.zoo import settle_batchnorm, synthetic_batches  # noqa: E402

Placement = tuple[dict[str, int], list[tuple[str, str, int]]]


def placement(path: Path) -> Placement:
    """Q/DQ counts and the ``(node, op, input index)`` each activation DQ feeds."""
    graph = onnx.load(path).graph
    consts = {t.name for t in graph.initializer}
    consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in graph.node:
        for i, name in enumerate(node.input):
            consumers.setdefault(name, []).append((node, i))
    producers = {o: n for n in graph.node for o in n.output}
    feeds = []
    for node in graph.node:
        if node.op_type == "DequantizeLinear" and node.input[0] not in consts and \
                producers.get(node.input[0]) is not None and \
                producers[node.input[0]].op_type == "QuantizeLinear":
            feeds += [(c.name, c.op_type, i) for c, i in consumers.get(node.output[0], [])]
    counts = {op: sum(n.op_type == op for n in graph.node)
              for op in ("QuantizeLinear", "DequantizeLinear")}
    return counts, sorted(feeds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    import torchvision

    from trtqat import quant_modules
    from trtqat.families.cnn.models import build_model
    from trtqat.quant.api import calibrate

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    quant_modules.initialize()  # the pytorch-quantization idiom
    try:
        user = torchvision.models.get_model(args.model, weights=None, num_classes=10)
    finally:
        quant_modules.deactivate()
    cli = build_model(args.model, 10, quantized=True)  # what `trtqat calibrate` builds
    data = synthetic_batches(2, 4, args.size)
    for model in (user, cli):
        settle_batchnorm(model, data)
    trtqat.quantize(user, {"method": "max"}, forward_loop=data)
    calibrate(cli, data, "max")
    example = synthetic_batches(1, 2, args.size, seed=5)[0]
    found = {}
    with tempfile.TemporaryDirectory(prefix="trtqat-pq-") as tmp:
        for tag, model in (("pytorch-quantization flow", user), ("CLI", cli)):
            path = Path(tmp) / f"{tag.split()[0]}.onnx"
            trtqat.export_onnx(model, example, path, "int8")
            found[tag] = placement(path)
    for tag, (counts, feeds) in found.items():
        print(f"{tag:<26} {counts['QuantizeLinear']} QuantizeLinear, "
              f"{counts['DequantizeLinear']} DequantizeLinear, {len(feeds)} activation "
              "DQ -> node inputs")
    (ca, fa), (cb, fb) = found.values()
    only_a, only_b = sorted(set(fa) - set(fb)), sorted(set(fb) - set(fa))
    same = ca == cb and fa == fb
    print(f"{args.model} at {args.size} px: {'same placement' if same else 'DIFFERENT'}"
          + ("" if same else f"; only pq: {only_a[:6]}; only CLI: {only_b[:6]}")
          + f" ({time.perf_counter() - t0:.0f} s)")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
