"""Activation memory of a QAT step: bytes saved for backward, fake-quantized vs FP32.

Counts, with ``torch.autograd.graph.saved_tensors_hooks``, the distinct storages that a
training forward keeps for backward, at batch ``b`` and ``2b``; the difference is what ``b``
more images cost (activations only: parameters and the fake-quantized weight copies do not
grow with the batch). ResNet18 in FP32 and fake-quantized with trtqat under each strategy:

* ``trtqat cpu``    the compiled C++ path: nothing kept when nothing was clipped, else the input;
* ``trtqat mask``   the CUDA path: a bit-packed clip mask instead of the input (the Triton
                    kernels; without a GPU they run in Triton's interpreter on the CPU);
* ``compiled``      ``torch.compile`` (inductor's decompositions and partitioner, eager
                    kernels: ``aot_eager_decomp_partition``) of FP32 and of trtqat.

This runs without a GPU, so it shows what each strategy keeps, not CUDA peak memory
(``qat_overhead.py --device cuda`` measures that).

    python benchmarks/qat_saved_memory.py [--batch 8] [--size 64] [--no-compile]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import torch

if not torch.cuda.is_available():  # the interpreter must be chosen before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torchvision  # noqa: E402
from torch import nn  # noqa: E402

import trtqat  # noqa: E402
from trtqat import quant_modules  # noqa: E402
from trtqat.quant import _kernels  # noqa: E402


def saved_bytes(model: nn.Module, x: torch.Tensor) -> int:
    """Bytes of the distinct non-parameter storages one forward keeps for backward."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(x)
    out.float().sum().backward()
    model.zero_grad(set_to_none=True)
    return sum(seen.values())


def _mask_path_on_cpu() -> None:
    """Serve CPU tensors with the GPU (mask-saving) kernels, as CUDA tensors are served."""
    from trtqat.quant import triton_kernels

    _kernels.fake_quant_forward_masked = (
        lambda x, amax, qmin, qmax: triton_kernels.forward(x, amax, qmin, qmax))


def main(argv: Sequence[str] | None = None) -> dict[str, int]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet18")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile rows")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    x = torch.randn(args.batch, 3, args.size, args.size)
    fp32 = getattr(torchvision.models, args.model)(weights=None).train()
    with quant_modules.initialized():
        qat = getattr(torchvision.models, args.model)(weights=None)
    qat.load_state_dict(fp32.state_dict(), strict=False)
    trtqat.collect_stats(qat, [x], progress=False)
    trtqat.compute_amax(qat, "max")
    qat.train()
    x2 = torch.cat([x, x.flip(0)])

    def per_batch(model: nn.Module) -> int:
        return saved_bytes(model, x2) - saved_bytes(model, x)

    rows = {"fp32": per_batch(fp32), "trtqat cpu": per_batch(qat)}
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        _mask_path_on_cpu()
    x, x2 = x.to(device), x2.to(device)
    rows["trtqat mask"] = per_batch(qat.to(device))
    qat.cpu()
    x, x2 = x.cpu(), x2.cpu()
    if not args.no_compile:
        for label, model in (("compiled fp32", fp32), ("compiled trtqat", qat)):
            torch._dynamo.reset()
            compiled = torch.compile(model, backend="aot_eager_decomp_partition", dynamic=False)
            rows[label] = per_batch(compiled)
    print(f"{args.model}, {args.batch} more images of 3x{args.size}x{args.size}: bytes saved for "
          "backward (activations only)")
    for label, n in rows.items():
        ref = rows["compiled fp32" if label.startswith("compiled") else "fp32"]
        print(f"  {label:<16} {n / 2**20:9.2f} MiB  {n / ref:6.3f}x FP32")
    sys.stdout.flush()
    return rows


if __name__ == "__main__":
    main()
