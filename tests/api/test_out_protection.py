"""The Python API replaces only trtqat's own files, as the command line does: never the
input ONNX (however its path is written), never a file trtqat did not write."""

from __future__ import annotations

import shutil

import pytest

import trtqat
from trtqat.errors import TrtqatError


def test_build_engine_out_refuses_the_input_and_foreign_files(tiny_onnx, tmp_path):
    onnx = tmp_path / "qdq.onnx"
    shutil.copyfile(tiny_onnx, onnx)
    before = onnx.read_bytes()
    (tmp_path / "sub").mkdir()
    for out in (onnx, tmp_path / "sub" / ".." / "qdq.onnx"):
        with pytest.raises(TrtqatError, match=r"^out .* is also the input onnx_path: .*choose "
                           "another out path$"):
            trtqat.build_engine(onnx, out=out)
    mine = tmp_path / "mine.onnx"
    shutil.copyfile(tiny_onnx, mine)  # an ONNX file, but not an engine trtqat saved
    with pytest.raises(TrtqatError, match="exists and is not an engine file: .*delete it or "
                       "choose another out path"):
        trtqat.build_engine(onnx, out=mine)
    assert onnx.read_bytes() == before and mine.read_bytes() == tiny_onnx.read_bytes()
    for _ in range(2):  # an engine trtqat saved is replaced
        assert trtqat.build_engine(onnx, out=tmp_path / "e.engine").path == tmp_path / "e.engine"


def test_export_onnx_replaces_only_its_own_exports(tiny_qcnn, images, tiny_onnx, tmp_path):
    mine = tmp_path / "mine.onnx"
    shutil.copyfile(tiny_onnx, mine)  # the user's own ONNX model
    with pytest.raises(TrtqatError, match="mine.onnx exists and is not an ONNX model trtqat "
                       "exported: .*delete it or choose another path"):
        trtqat.export_onnx(tiny_qcnn, images[:2], mine, "fp32", validate=False)
    assert mine.read_bytes() == tiny_onnx.read_bytes()
    import onnx

    earlier = onnx.load(str(tiny_onnx))
    earlier.producer_name = "trtqat"  # what an earlier export carries
    ours = tmp_path / "ours.onnx"
    onnx.save(earlier, str(ours))
    result = trtqat.export_onnx(tiny_qcnn, images[:2], ours, "fp32", validate=False)
    assert result.path == ours and ours.read_bytes() != mine.read_bytes()
