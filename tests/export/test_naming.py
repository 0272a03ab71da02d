"""Output file names."""

from __future__ import annotations

import pytest

from trtqat.export import artifact_name, expand_variants


def test_names_say_what_they_are():
    assert artifact_name("resnet18", "qat", "int8") == "resnet18-qat-int8.onnx"
    assert artifact_name("resnet18", "ptq", "int8-fp16") == "resnet18-ptq-int8-fp16.onnx"
    assert artifact_name("resnet50", "fp32", "fp16") == "resnet50-fp16.onnx"
    assert artifact_name("mobilenet_v2", "qat", "fp32", batch=8) == "mobilenet_v2-qat-fp32-b8.onnx"


def test_variants():
    assert expand_variants("all") == ("fp32", "fp16", "int8", "int8-fp16")
    assert expand_variants("all", "fp8") == ("fp32", "fp16", "fp8", "fp8-fp16")
    assert expand_variants("int8") == ("int8",)
    with pytest.raises(ValueError):
        expand_variants("int3")
