"""``trtqat.export_onnx``: the exporter and checks of ``trtqat export``, with the plan of
the model's family (image classifiers, Vision Transformers; encoders: tests/families/encoder)."""

from __future__ import annotations

import onnx
import pytest
import torch
from onnx import TensorProto
from torch import nn

import trtqat
from trtqat import families
from trtqat.export import ExportError, ValidationError
from trtqat.export import export_onnx as exporter_export_onnx
from trtqat.quant.model_ops import collect_stats, compute_amax


def _meta(path) -> dict[str, str]:
    return {p.key: p.value for p in onnx.load(str(path)).metadata_props}


def test_a_cnn_goes_through_the_exporter_of_trtqat_export(tiny_qcnn, images, tmp_path):
    result = trtqat.export_onnx(tiny_qcnn, images[:2], tmp_path / "m.onnx", "int8",
                                validation_data=[(images, torch.zeros(32))],
                                metadata={"owner": "me"})
    assert isinstance(result, trtqat.ExportResult) and result.passed
    assert (result.path, result.variant, result.opset) == (tmp_path / "m.onnx", "int8", 17)
    names = [c.name for c in result.checks]
    assert names[0] == "onnx.checker" and any("top-1 agreement" in n for n in names)
    assert result.lint is not None and result.lint.ok and result.dynamic_axes == ("batch",)
    meta = _meta(result.path)
    assert meta["trtqat.family"] == "cnn" and meta["owner"] == "me"
    # the same graph as the exporter itself writes
    plain = exporter_export_onnx(tiny_qcnn, images[:2], tmp_path / "plain.onnx", "int8")
    ops = [n.op_type for n in onnx.load(str(plain.path)).graph.node]
    assert [n.op_type for n in onnx.load(str(result.path)).graph.node] == ops


def test_dict_inputs_follow_forward_and_name_the_onnx_inputs(tmp_path):
    class TwoInputs(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, features: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
            return self.fc(features) * scale

    model = TwoInputs().eval()
    example = {"scale": torch.rand(2, 1) + 0.5, "features": torch.randn(2, 4)}
    result = trtqat.export_onnx(model, example, tmp_path / "two.onnx", "fp32",
                                validation_data=[{"features": torch.randn(5, 4),
                                                  "scale": torch.rand(5, 1)}])
    assert result.passed
    graph = onnx.load(str(result.path)).graph
    assert [i.name for i in graph.input] == ["features", "scale"]
    with pytest.raises(ExportError, match="holds 'bias', which TwoInputs.forward does not take"):
        trtqat.export_onnx(model, {**example, "bias": torch.zeros(1)}, tmp_path / "x.onnx")
    with pytest.raises(ExportError, match="lacks 'features'"):
        trtqat.export_onnx(model, {"scale": example["scale"]}, tmp_path / "x.onnx", "fp32")
    assert not (tmp_path / "x.onnx").exists()


def test_a_failed_check_raises_and_keeps_no_file(tiny_qcnn, images, tmp_path):
    for _, module in tiny_qcnn.named_modules():  # an output the file cannot reproduce
        if isinstance(module, nn.Linear):
            module.register_forward_hook(lambda m, i, o: o + 1e3 * torch.rand_like(o))
    with pytest.raises(ValidationError) as info:
        trtqat.export_onnx(tiny_qcnn, images[:2], tmp_path / "bad.onnx", "fp32")
    assert not info.value.result.passed and not (tmp_path / "bad.onnx").exists()


def test_a_vit_keeps_layernorm_and_softmax_in_float32_in_fp16(tmp_path):
    vit = families.get("vit")
    model = vit.build("vit_tiny", 10, image_size=16)
    assert families.of_module(model) is vit
    vit.quantize(model)
    assert families.of_module(model) is vit
    data = [torch.randn(4, 3, 16, 16) for _ in range(2)]
    collect_stats(model, data, progress=False)
    compute_amax(model, "max")
    result = trtqat.export_onnx(model, data[0][:2], tmp_path / "vit-fp16.onnx", "fp16",
                                validation_data=data)
    assert result.passed and _meta(result.path)["trtqat.family"] == "vit"
    graph = onnx.load(str(result.path)).graph
    kinds = {t.name: t.data_type for t in graph.initializer}
    norms = [n for n in graph.node if n.op_type == "LayerNormalization"]
    assert norms and all(kinds[n.input[1]] == TensorProto.FLOAT for n in norms)
    assert TensorProto.FLOAT16 in kinds.values()  # the rest computes in fp16
