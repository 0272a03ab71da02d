"""The Python API refuses bad values as the CLI does: one line of the user-error family
(:class:`trtqat.TrtqatError`) that names the key, what it takes and what was given, before
any work (issue 32: shapes, io_dtype, config value types, a model name for a model)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import trtqat


def _net() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(4, 3)).eval()


def _bench(tiny_onnx, shapes):
    engine = trtqat.build_engine(tiny_onnx)
    return trtqat.benchmark(engine, shapes=shapes, duration=0.01, warmup=0.0, iterations=1)


CASES = {
    # shapes: every dimension an int >= 1 (an empty batch timed ~38k qps), names that exist
    "build-zero-batch": (lambda o, t: trtqat.build_engine(o, shapes={"input": (0, 4)}),
                         ("zero dimension", "'input'", ">= 1")),
    "bench-zero-batch": (lambda o, t: _bench(o, {"input": (0, 4)}), ("zero dimension",)),
    "bench-negative": (lambda o, t: _bench(o, {"input": (-1, 4)}), ("negative dimension",)),
    "bench-string-dim": (lambda o, t: _bench(o, {"input": ("2", 4)}), ("integers only",)),
    "bench-unknown-name": (lambda o, t: _bench(o, {"inputs": (2, 4)}), ("unknown input",)),
    # export_onnx(io_dtype=): the allowed set, listed
    "io-dtype": (lambda o, t: trtqat.export_onnx(_net(), torch.randn(2, 3, 8, 8),
                                                 t / "m.onnx", "fp32", io_dtype="int3"),
                 ("'int3'", "fp32", "fp16")),
    "opset-string": (lambda o, t: trtqat.export_onnx(_net(), torch.randn(2, 3, 8, 8),
                                                     t / "m.onnx", "fp32", opset="17"),
                     ("opset must be an int", "'17'")),
    # config values: bool keys take bools, numbers refuse strings and non-finite values
    "config-bool": (lambda o, t: trtqat.quantize(_net(), {"graph": "no"}),
                    ("QuantConfig.graph", "bool", "'no'")),
    "config-int": (lambda o, t: trtqat.quantize(_net(), {"num_batches": "3"}),
                   ("QuantConfig.num_batches", "integer", "'3'")),
    "config-float": (lambda o, t: trtqat.quantize(_net(), {"percentile": "abc"}),
                     ("QuantConfig.percentile", "number", "'abc'")),
    "config-inf": (lambda o, t: trtqat.quantize(_net(), {"percentile": float("inf")}),
                   ("QuantConfig.percentile", "finite", "inf")),
    "config-typo": (lambda o, t: trtqat.quantize(_net(), {"graf": True}),
                    ("'graf'", "did you mean 'graph'")),
    # build options: the same type checks, unknown keywords get "did you mean"
    "build-bool": (lambda o, t: trtqat.build_engine(o, fp16="yes"),
                   ("BuildOptions.fp16", "bool", "'yes'")),
    "build-float": (lambda o, t: trtqat.build_engine(o, min_top1="0.9"),
                    ("BuildOptions.min_top1", "number", "'0.9'")),
    "build-typo": (lambda o, t: trtqat.build_engine(o, fp61=True),
                   ("'fp61'", "did you mean 'fp16'")),
    # a model name where a module goes
    "quantize-name": (lambda o, t: trtqat.quantize("resnet18"),
                      ("torch.nn.Module", "got str", "get_model('resnet18')")),
    "export-name": (lambda o, t: trtqat.export_onnx("resnet18", torch.randn(1, 3, 8, 8),
                                                    t / "m.onnx"), ("torch.nn.Module",)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_api_refuses_bad_values_in_one_line(case, tiny_onnx, tmp_path):
    call, needles = CASES[case]
    with pytest.raises(trtqat.TrtqatError) as info:
        call(tiny_onnx, tmp_path)
    message = str(info.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, message
    assert list(tmp_path.iterdir()) == []  # nothing written
