"""Activation memory of a QAT step: bytes saved for backward, fake-quantized vs FP32, by kind.

Counts, with ``torch.autograd.graph.saved_tensors_hooks``, the distinct storages that a
training forward keeps for backward, at batch ``b`` and ``2b``; the difference is what ``b``
more images cost (activations), and ``2 * at_b - at_2b`` what does not grow with the batch
(the fake-quantized weight copies and their autocast copies; parameters are not counted).
Each storage is put in the kind of what produced it, the first time it is saved:

* ``q-saved``   what a quantizer's own autograd function keeps (a bit-packed mask, or the
                input when it clipped: usually the ReLU output already counted under
                ``other``), and the lean path's clip masks;
* ``fq-act``    fake-quantized activations (a quantizer's output, saved by the next layer);
* ``fq-wgt``    fake-quantized weights;
* ``autocast``  autocast's low-precision copies (``ToCopyBackward0`` outputs);
* ``codes``     the integer codes the lean conv/linear path keeps (``trtqat.quant.lean_backward``);
* ``other``     everything else (layer outputs, ReLU results, BN statistics, the image).

Rows: FP32, and trtqat with the plain layer path (``plain``: quantizer, then the layer,
which saves the quantized copy) and the lean path (``lean``: the default for GPU tensors,
for CPU ones with ``TRTQAT_LEAN_BACKWARD=1``; this script switches it itself), each with

* ``cpu``       the compiled C++ kernels: a quantizer keeps nothing when nothing was clipped;
* ``mask``      the CUDA kernels (Triton; without a GPU in Triton's interpreter on the CPU),
                which keep a bit-packed clip mask;
* ``compiled``  ``torch.compile`` (``aot_eager_decomp_partition``: inductor's decompositions
                and partitioner with eager kernels; ``--compile-backend inductor`` for the
                real thing, slower to compile) of FP32 and trtqat: the partitioner decides
                what to keep, so kinds are not told apart there (all ``other``). ``compiled
                trtqat`` is what any ``torch.compile`` of a trtqat model keeps (its quantizers
                are recomputed in backward: ``trtqat.quant.fake_quant_op.traced``);
                ``compiled keep`` the same model with that turned off
                (``set_recompute(False)``): the partitioner keeps the quantized copies and
                bool clip / ReLU masks.

``--amp bf16`` runs the forward under ``torch.autocast(<device>, dtype=torch.bfloat16)``.
This runs without a GPU, so it shows what each strategy keeps, not CUDA peak memory
(``qat_overhead.py --device cuda`` measures that).

    python benchmarks/qat_saved_memory.py [--models resnet18,resnet50] [--amp none,bf16]
        [--batch 4] [--size 64] [--no-compile] [--compile-backend B] [--no-mask]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator, Sequence

import torch

if not torch.cuda.is_available():  # the interpreter must be chosen before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torchvision  # noqa: E402
from torch import nn  # noqa: E402

import trtqat  # noqa: E402
from trtqat import quant_modules  # noqa: E402
from trtqat.quant import _kernels, fake_quant_op, lean_backward  # noqa: E402
from trtqat.quant.tensor_quantizer import TensorQuantizer  # noqa: E402

KINDS = ("q-saved", "fq-act", "fq-wgt", "autocast", "codes", "other")
_CODE_DTYPES = (torch.int8, torch.uint8, torch.int16)


class _Tags:
    """Where each tensor came from: quantizer outputs, and whether a quantizer is running."""

    def __init__(self, model: nn.Module) -> None:
        self.weight_quantizers = {id(m._weight_quantizer) for m in model.modules()
                                  if isinstance(getattr(m, "_weight_quantizer", None), nn.Module)}
        self.outputs: dict[int, str] = {}
        self.alive: list[torch.Tensor] = []  # so no later tensor reuses an output's memory
        self.depth = 0

    def kind(self, t: torch.Tensor) -> str:
        ptr = t.untyped_storage().data_ptr()
        if self.depth:
            return "q-saved"
        if ptr in self.outputs:
            return self.outputs[ptr]
        if t.grad_fn is not None and t.grad_fn.name() == "ToCopyBackward0":
            return "autocast"
        if t.dtype in _CODE_DTYPES:
            return "codes"
        if t.dtype == torch.bool:
            return "q-saved"
        return "other"


@contextlib.contextmanager
def _tagging(tags: _Tags) -> Iterator[None]:
    """Record quantizer outputs and calls (a class-level wrapper: no module hooks, which
    would send the layers down the plain path)."""
    original = TensorQuantizer.forward

    def forward(self, inputs):
        tags.depth += 1
        try:
            out = original(self, inputs)
        finally:
            tags.depth -= 1
        if isinstance(out, torch.Tensor) and out is not inputs:
            kind = "fq-wgt" if id(self) in tags.weight_quantizers else "fq-act"
            tags.outputs[out.untyped_storage().data_ptr()] = kind
            tags.alive.append(out)
        return out

    TensorQuantizer.forward = forward
    try:
        yield
    finally:
        TensorQuantizer.forward = original


def saved_bytes(model: nn.Module, x: torch.Tensor, amp: str = "none",
                tag: bool = True) -> dict[str, int]:
    """Bytes of the distinct non-parameter storages one forward keeps for backward, by kind."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    tags = _Tags(model)
    seen: dict[int, tuple[str, int]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in params and ptr not in seen:
            seen[ptr] = (tags.kind(t) if tag else "other", storage.nbytes())
        return t

    tagging = _tagging(tags) if tag else contextlib.nullcontext()
    with tagging, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=amp == "bf16"):
        out = model(x)
    out.float().sum().backward()
    model.zero_grad(set_to_none=True)
    kinds = dict.fromkeys(KINDS, 0)
    for kind, n in seen.values():
        kinds[kind] += n
    return kinds


def _mask_path_on_cpu() -> None:
    """Serve CPU tensors with the GPU (mask-saving) kernels, as CUDA tensors are served."""
    from trtqat.quant import triton_kernels

    _kernels.fake_quant_forward_masked = (
        lambda x, amax, qmin, qmax: triton_kernels.forward(x, amax, qmin, qmax))


def _models(name: str, x: torch.Tensor) -> tuple[nn.Module, nn.Module]:
    """The FP32 model and its fake-quantized twin (same weights), max-calibrated on ``x``."""
    torch.manual_seed(0)
    fp32 = getattr(torchvision.models, name)(weights=None).train()
    with quant_modules.initialized():
        qat = getattr(torchvision.models, name)(weights=None)
    qat.load_state_dict(fp32.state_dict(), strict=False)
    trtqat.collect_stats(qat, [x], progress=False)
    trtqat.compute_amax(qat, "max")
    return fp32, qat.train()


def _measure(model: nn.Module, x: torch.Tensor, x2: torch.Tensor, amp: str,
             tag: bool = True) -> dict[str, tuple[int, int]]:
    """Per kind: (bytes the second ``b`` images add, bytes independent of the batch)."""
    one, two = saved_bytes(model, x, amp, tag), saved_bytes(model, x2, amp, tag)
    return {k: (two[k] - one[k], 2 * one[k] - two[k]) for k in KINDS}


def _rows(name: str, amp: str, args: argparse.Namespace) -> dict[str, dict[str, tuple[int, int]]]:
    torch.manual_seed(0)
    x = torch.randn(args.batch, 3, args.size, args.size)
    x2 = torch.cat([x, x.flip(0)])
    fp32, qat = _models(name, x)
    rows = {"fp32": _measure(fp32, x, x2, amp)}
    for label, lean in (("plain cpu", False), ("lean cpu", True)):
        with lean_backward.using(lean):
            rows[label] = _measure(qat, x, x2, amp)
    if not args.no_mask:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        saved = _kernels.fake_quant_forward_masked
        if device == "cpu":
            _mask_path_on_cpu()
        try:
            qat.to(device)
            for label, lean in (("plain mask", False), ("lean mask", True)):
                with lean_backward.using(lean):
                    rows[label] = _measure(qat, x.to(device), x2.to(device), amp)
        finally:
            _kernels.fake_quant_forward_masked = saved
            qat.cpu()
    if not args.no_compile:
        for label, model, recompute in (("compiled fp32", fp32, True),
                                        ("compiled trtqat", qat, True),
                                        ("compiled keep", qat, False)):
            previous = fake_quant_op.set_recompute(recompute)
            try:
                torch._dynamo.reset()
                compiled = torch.compile(model, backend=args.compile_backend, dynamic=False)
                rows[label] = _measure(compiled, x, x2, amp, tag=False)
            finally:
                fake_quant_op.set_recompute(previous)
    return rows


def _print(name: str, amp: str, args: argparse.Namespace,
           rows: dict[str, dict[str, tuple[int, int]]]) -> None:
    mib = 2 ** 20
    print(f"\n{name}, amp {amp}: MiB saved for backward by {args.batch} more images of "
          f"3x{args.size}x{args.size} (activations), then (fixed) what does not grow with the "
          "batch")
    print(f"  {'':<22}" + "".join(f"{k:>9}" for k in KINDS) + f"{'total':>9}{'x FP32':>8}")
    for label, kinds in rows.items():
        ref_row = rows["compiled fp32" if label.startswith("compiled") else "fp32"]
        for col, suffix in ((0, ""), (1, " (fixed)")):
            ref = sum(v[col] for v in ref_row.values())
            total = sum(v[col] for v in kinds.values())
            ratio = f"{total / ref:8.3f}" if ref >= 2 ** 20 else f"{'-':>8}"  # not of ~0
            print(f"  {label + suffix:<22}" + "".join(f"{kinds[k][col] / mib:9.2f}" for k in KINDS)
                  + f"{total / mib:9.2f}{ratio}")
    sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> dict[tuple[str, str], dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", "--model", default="resnet18",
                   help="comma-separated torchvision models (default resnet18)")
    p.add_argument("--amp", default="none",
                   help="comma-separated: none (float32) and/or bf16 (autocast); default none")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile rows")
    p.add_argument("--compile-backend", default="aot_eager_decomp_partition",
                   help="torch.compile backend of the compiled rows (default "
                        "aot_eager_decomp_partition: inductor's partitioner, eager kernels)")
    p.add_argument("--no-mask", action="store_true", help="skip the mask (Triton) rows")
    args = p.parse_args(argv)
    amps = [a.strip() for a in args.amp.split(",") if a.strip()]
    bad = [a for a in amps if a not in ("none", "bf16")]
    if bad:
        p.error(f"--amp takes none and/or bf16, got {','.join(bad)}")
    results = {}
    for name in (m.strip() for m in args.models.split(",") if m.strip()):
        for amp in amps:
            results[name, amp] = rows = _rows(name, amp, args)
            _print(name, amp, args, rows)
    return results


if __name__ == "__main__":
    main()
