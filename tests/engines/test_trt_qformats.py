"""The TensorRT builder with FP8 and INT4 files, on the fake tensorrt (10 and 11 flavours).

The fake refuses what TensorRT 10 refuses: FP8/INT4 initializers in a weakly typed network
without BuilderFlag.FP8/INT4, and any precision flag in a strongly typed network."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from trtqat.cli.exec_cmd import main
from trtqat.engines import EngineBuildError, OptionsError, build_engine

from .conftest import make_conv_model
from .fake_tensorrt import make_module
from .qformat_nets import fp8_conv, int4_matmul, mixed_net
from .test_qformats import _as_written

FAST = ["--warmUp=0", "--duration=0", "--iterations=3"]


def _flags(trt) -> list[str]:
    return [args[0] for name, args in trt._calls if name == "IBuilderConfig.set_flag"]


def _network_flags(trt) -> int:
    return next(args[0] for name, args in trt._calls if name == "Builder.create_network")


def test_format_flags_follow_the_file(fake_trt, tmp_path: Path) -> None:
    """FP8 -> BuilderFlag.FP8, INT4 -> INT4 + FP16 (weight-only: FP16 GEMM) in TensorRT 10;
    nothing in 11; the engine runs the file's maths and names its precision."""
    trt10 = fake_trt._major < 11
    for path, flags in ((fp8_conv(tmp_path / "fp8.onnx"), ["FP8"]),
                        (fp8_conv(tmp_path / "fp8c.onnx", compressed=True), ["FP8"]),
                        (int4_matmul(tmp_path / "int4.onnx"), ["FP16", "INT4"])):
        fake_trt._calls.clear()
        engine = build_engine(path, "tensorrt")
        assert sorted(_flags(fake_trt)) == (flags if trt10 else [])
        assert _network_flags(fake_trt) == 0  # weakly typed in 10 is enough
        assert engine.header["precision"] == engine.header["quant_formats"][0]
        model = onnx.load(str(path))
        dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
        feed = {"x": np.random.default_rng(0).uniform(-1, 1, dims).astype(np.float32)}
        want = _as_written(model, feed)
        with engine.runner() as runner:  # (the fake runs ORT: MatMulNBits with int8 inputs)
            np.testing.assert_allclose(runner.infer(feed)["y"], want, rtol=0,
                                       atol=1e-2 * np.abs(want).max())


def test_int8_with_fp8_builds_strongly_typed_in_10(fake_trt, tmp_path: Path, caplog) -> None:
    with caplog.at_level(logging.INFO, logger="trtqat"):
        engine = build_engine(mixed_net(tmp_path / "mixed.onnx"), "tensorrt",
                              shapes={"x": (2, 3, 8, 8)})
    assert _flags(fake_trt) == []
    if fake_trt._major < 11:
        bit = 1 << int(fake_trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
        assert _network_flags(fake_trt) == bit and engine.header["strongly_typed"]
        assert "holds INT8 and FP8 Q/DQ" in caplog.text
    else:
        assert _network_flags(fake_trt) == 0


def test_precision_flag_rules_of_tensorrt_10(fake_trt, tmp_path: Path, caplog) -> None:
    """--stronglyTyped drops precision flags (TensorRT 10 refuses them there); --fp8 with
    --int8/--best is one line in 10 (trtexec refuses it); --fp8 on a file without FP8 only
    allows FP8 tactics. TensorRT 11 ignores every precision flag."""
    fp8 = fp8_conv(tmp_path / "fp8.onnx")
    plain = make_conv_model(tmp_path / "float.onnx", batch=1)
    with caplog.at_level(logging.WARNING, logger="trtqat"):
        engine = build_engine(fp8, "tensorrt", strongly_typed=True, fp16=True)
    assert _flags(fake_trt) == [] and "fp16" in engine.header["ignored_options"]
    trt10 = fake_trt._major < 11
    assert ("not allowed in a strongly typed network" in caplog.text) == trt10
    for kwargs in ({"fp8": True, "int8": True}, {"best": True}):
        if trt10:
            with pytest.raises(OptionsError, match="cannot be enabled together") as info:
                build_engine(fp8, "tensorrt", **kwargs)
            assert "\n" not in str(info.value)
        else:
            build_engine(fp8, "tensorrt", **kwargs)
    fake_trt._calls.clear()
    engine = build_engine(plain, "tensorrt", fp8=True)
    assert _flags(fake_trt) == (["FP8"] if trt10 else [])
    assert engine.header["precision"] == "fp32"
    if trt10:
        with pytest.raises(OptionsError, match="--best and --stronglyTyped"):
            build_engine(plain, "tensorrt", best=True, strongly_typed=True)


def test_fp8_or_int4_file_on_a_tensorrt_without_them_is_one_line(tmp_path: Path, monkeypatch,
                                                                  fake_cuda) -> None:
    old = make_module("8.6.1", without=("BuilderFlag.FP8", "BuilderFlag.INT4", "DataType.FP8",
                                        "DataType.INT4", "BuilderFlag.FP4", "DataType.FP4"))
    monkeypatch.setitem(sys.modules, "tensorrt", old)
    build_engine(make_conv_model(tmp_path / "float.onnx", batch=1), "tensorrt")  # still builds
    old._calls.clear()
    for path, flag in ((fp8_conv(tmp_path / "fp8.onnx"), "FP8"),
                       (int4_matmul(tmp_path / "int4.onnx"), "INT4")):
        with pytest.raises(EngineBuildError) as info:
            build_engine(path, "tensorrt")
        message = str(info.value)
        assert f"which TensorRT 8.6.1 cannot build (it has no BuilderFlag.{flag})" in message
        assert "TensorRT 10 or newer" in message and "\n" not in message
    assert "Builder.build_serialized_network" not in [name for name, _ in old._calls]


def test_exec_takes_fp8_and_int4(fake_trt, tmp_path: Path, capsys) -> None:
    path = fp8_conv(tmp_path / "fp8.onnx")
    rc = main([f"--onnx={path}", "--backend=tensorrt", "--fp8", *FAST])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "not supported by trtqat-exec" not in err
    assert "Precision: fp8 (from the ONNX file)" in out.splitlines()
    assert "takes precision from the ONNX graph" not in err  # the file holds FP8 already
    plain = make_conv_model(tmp_path / "float.onnx", batch=1)
    rc = main([f"--onnx={plain}", "--backend=tensorrt", "--fp8", *FAST])
    out, err = capsys.readouterr()
    assert rc == 0, err
    if fake_trt._major >= 11:
        assert "--fp8: TensorRT 11.4.0.106 takes precision from the ONNX graph" in err
        assert "trtqat export --variant fp8'" in err
    rc = main([f"--onnx={path}", "--backend=ort", "--int4", *FAST])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "--int4: ONNX Runtime takes precision from the ONNX graph" in err
    assert "NOTE FP8 Q/DQ run emulated in float32" in err
