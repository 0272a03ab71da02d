"""FP8 E4M3 export (issue 36): FP8 Q/DQ in the file, bit-exact against PyTorch where the
float math is the same, the two weight forms, and the one-line refusals."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto
from torch import nn

import trtqat
from trtqat.errors import TrtqatError
from trtqat.export import ExportError
from trtqat.export.validate import ort_session, run_ort
from trtqat.quant.fp8 import fp8_scale
from trtqat.quant.model_ops import quantizers
from trtqat.quant.tensor_quantizer import TensorQuantizer

FP8 = TensorProto.FLOAT8E4M3FN


def _data(n: int = 2, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(4, 3, 8, 8, generator=g) * 3 for _ in range(n)]


@pytest.fixture(scope="module")
def fp8_model() -> nn.Module:
    """Conv -> ReLU -> Linear, FP8 E4M3 inputs and per-channel weights, max-calibrated."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(),
                          nn.Linear(8 * 8 * 8, 5)).eval()
    return trtqat.quantize(model, {"format": "fp8"}, forward_loop=_data())


@pytest.fixture(scope="module")
def fp8_files(fp8_model, tmp_path_factory) -> dict[str, onnx.ModelProto]:
    from trtqat.export import Exporter

    out = tmp_path_factory.mktemp("fp8")
    exporter = Exporter(fp8_model, _data(1, seed=1)[0], validation_data=_data(2, seed=2))
    files = {}
    for key, variant, weights in (("compressed", "fp8", "compressed"),
                                  ("qdq", "fp8", "qdq"), ("fp16", "fp8-fp16", "compressed")):
        result = exporter.export(out / f"m-{key}.onnx", variant, fp8_weights=weights)
        assert result.passed and result.lint is not None and result.lint.ok, result.lines()
        assert result.opset == 19  # the default opset, raised to FP8's minimum
        files[key] = str(result.path)
    return files


def _dq_outputs(path: str, x: torch.Tensor) -> dict[str, np.ndarray]:
    """Every DequantizeLinear output of the file, by quantizer name, run in ORT."""
    model = onnx.load(path)
    names = {}
    for node in model.graph.node:
        if node.op_type == "DequantizeLinear":
            names[node.output[0]] = node.name.split("/")[0]
            model.graph.output.append(onnx.helper.make_tensor_value_info(
                node.output[0], TensorProto.FLOAT, None))
    tmp = path.replace(".onnx", "-dq.onnx")
    onnx.save(model, tmp)
    session = ort_session(tmp)
    outs = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    return {names[o.name]: v for o, v in zip(session.get_outputs(), outs) if o.name in names}


def test_fp8_qdq_are_bit_exact_with_pytorch(fp8_model, fp8_files):
    """The first activation and every weight: ORT's dequantized values equal PyTorch's
    fake-FP8 values bit for bit (both weight forms); the logits agree to float rounding."""
    x = _data(1, seed=3)[0]
    seen = {}
    hooks = [q.register_forward_hook(lambda m, i, o, n=n: seen.__setitem__(n, o.detach()))
             for n, q in quantizers(fp8_model)]
    with torch.no_grad():
        want = fp8_model(x).numpy()
    for h in hooks:
        h.remove()
    exact = ["0._input_quantizer", "0._weight_quantizer", "3._weight_quantizer"]
    scales = {n: q.amax for n, q in quantizers(fp8_model)}
    file = onnx.load(fp8_files["compressed"])
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in file.graph.initializer}
    for node in file.graph.node:  # every scale is the float32 PyTorch divides by
        if node.op_type == "DequantizeLinear":
            want_scale = fp8_scale(scales[node.name.split("/")[0]]).reshape(-1).numpy()
            np.testing.assert_array_equal(inits[node.input[1]].reshape(-1), want_scale)
    for key in ("compressed", "qdq"):
        got = _dq_outputs(fp8_files[key], x)
        for name in exact:
            np.testing.assert_array_equal(got[name], seen[name].numpy(), err_msg=name)
        session = ort_session(fp8_files[key])
        np.testing.assert_allclose(run_ort(session, (x,))[0], want, rtol=1e-4, atol=1e-4)


def test_fp8_graph_form(fp8_files):
    """Every Q/DQ has an FLOAT8E4M3FN zero point of 0; compressed weights are FP8
    initializers read by DequantizeLinear (1 byte per weight), qdq keeps float weights."""
    forms = {}
    for key, path in fp8_files.items():
        model = onnx.load(path)
        inits = {t.name: t for t in model.graph.initializer}
        qdq = [n for n in model.graph.node
               if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
        assert qdq and all(inits[n.input[2]].data_type == FP8 for n in qdq)
        assert all(not any(inits[n.input[2]].raw_data) for n in qdq)  # zero
        weight_q = [n for n in qdq if n.op_type == "QuantizeLinear" and n.input[0] in inits]
        fp8_weights = [t for t in inits.values() if t.data_type == FP8 and len(t.dims) > 1]
        forms[key] = (len(weight_q), len(fp8_weights))
        meta = {p.key: p.value for p in model.metadata_props}
        assert meta["trtqat.opset"] == "19"
    assert forms["compressed"] == (0, 2) and forms["fp16"] == (0, 2)
    assert forms["qdq"] == (2, 0)
    fp16 = onnx.load(fp8_files["fp16"])
    assert {t.data_type for t in fp16.graph.initializer if t.name.endswith("bias")} == \
        {TensorProto.FLOAT16}


def _mixed(model: nn.Module) -> nn.Module:
    import copy

    mixed = copy.deepcopy(model)
    mixed[3]._input_quantizer.num_bits = 8
    return mixed


@pytest.mark.parametrize("case, match", [
    ("opset", "FP8 Q/DQ needs opset >= 19; use --opset 19 or leave --opset out"),
    ("int8-of-fp8", "quantized in FP8, so it has no int8 variant"),
    ("fp8-of-int8", "quantized in INT8, so it has no fp8 variant"),
    ("mixed", "mixed formats are not supported"),
    ("weights", r"fp8_weights \(--fp8-weights\) 'packed' is unknown: use compressed or qdq"),
])
def test_bad_fp8_requests_are_one_line_errors(case, match, fp8_model, tmp_path):
    from export_testlib import make_tiny

    model, variant, kwargs = fp8_model, "fp8", {}
    if case == "opset":
        kwargs = {"opset": 17}
    elif case == "int8-of-fp8":
        variant = "int8"
    elif case == "fp8-of-int8":
        model = make_tiny()
    elif case == "mixed":
        model = _mixed(fp8_model)
    else:
        kwargs = {"fp8_weights": "packed"}
    x = torch.randn(2, 3, 16, 16) if case == "fp8-of-int8" else _data(1)[0]
    with pytest.raises(ExportError, match=match) as info:
        trtqat.export_onnx(model, x, tmp_path / "m.onnx", variant=variant, **kwargs)
    assert "\n" not in str(info.value)
    assert not list(tmp_path.iterdir())  # nothing written


def test_int8_fp16_still_raises_a_low_opset(tmp_path):
    from export_testlib import make_tiny

    result = trtqat.export_onnx(make_tiny(), torch.randn(2, 3, 16, 16), tmp_path / "m.onnx",
                                variant="int8-fp16", opset=17, validate=False)
    assert result.opset == 19


@pytest.mark.filterwarnings("ignore")
def test_plain_torchscript_export_of_fp8_is_refused(fp8_model, tmp_path):
    """Only trtqat's export writes FP8 Q/DQ; a plain TorchScript export would write INT8."""
    TensorQuantizer.use_fb_fake_quant = True
    try:
        with pytest.raises(TrtqatError, match="exports only through trtqat"):
            torch.onnx.export(fp8_model, (_data(1)[0],), str(tmp_path / "m.onnx"),
                              opset_version=19, dynamo=False)
    finally:
        TensorQuantizer.use_fb_fake_quant = False


def test_cli_exports_an_fp8_checkpoints_own_variants(tmp_path, monkeypatch, capsys):
    """``--variant all`` of an FP8 checkpoint: the float variants and fp8, fp8-fp16; an
    int8 variant of it, or an explicit opset below 19: one line, nothing written."""
    from export_testlib import TinyResNet, batches

    from trtqat.cli import main
    from trtqat.families.cnn import CNNFamily
    from trtqat.runs.checkpoint import save_checkpoint

    torch.manual_seed(0)
    model = trtqat.quantize(TinyResNet(), {"format": "fp8"}, forward_loop=batches(2))
    monkeypatch.setattr(CNNFamily, "load", lambda self, ckpt, *_: model)
    spec = {"arch": "tiny", "num_classes": 10, "image_size": 16, "quantized": True,
            "skip_layers": [], "format": "fp8"}
    ckpt = save_checkpoint(tmp_path / "qat" / "best.pt",
                           {"stage": "qat", "model": spec, "state_dict": {}})
    out = tmp_path / "export"
    base = ["export", "--checkpoint", str(ckpt), "--out", str(out), "--data", "synthetic",
            "--val-batches", "1"]
    for extra, message in ((["--variant", "int8"], "quantized in FP8, so it has no int8 "
                            "variant: use --variant fp32, fp16, fp8, fp8-fp16 or all"),
                           (["--variant", "fp8", "--opset", "18"], "use --opset 19")):
        assert main([*base, *extra]) == 1
        err = capsys.readouterr().err.strip()
        assert message in err and "\n" not in err
        assert not out.exists()
    rc = main([*base, "--fp8-weights", "qdq"])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert sorted(p.name for p in out.glob("*.onnx")) == [
        "tiny-qat-fp16.onnx", "tiny-qat-fp32.onnx", "tiny-qat-fp8-fp16.onnx",
        "tiny-qat-fp8.onnx"]
    assert "FAIL" not in text and text.count("PASS  TensorRT Q/DQ lint") == 2
    graph = onnx.load(str(out / "tiny-qat-fp8.onnx")).graph  # --fp8-weights qdq: float weights
    inits = {t.name for t in graph.initializer}
    assert any(n.op_type == "QuantizeLinear" and n.input[0] in inits for n in graph.node)


def test_fp8_of_an_fp32_checkpoint_says_calibrate_with_format_fp8(tmp_path, capsys):
    from trtqat.cli import main
    from trtqat.runs.checkpoint import save_checkpoint

    spec = {"arch": "resnet18", "num_classes": 10, "image_size": 16, "quantized": False,
            "skip_layers": []}
    ckpt = save_checkpoint(tmp_path / "fp32" / "best.pt",
                           {"stage": "fp32", "model": spec, "state_dict": {}})
    assert main(["export", "--checkpoint", str(ckpt), "--variant", "fp8", "--out",
                 str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip()
    assert "no FP8 form: run `trtqat calibrate` (PTQ) or `trtqat qat` first with --format " \
        "fp8" in err and "\n" not in err
    assert not (tmp_path / "out").exists()
