"""export.json sums up every variant exported into a folder, not only the last command's."""

import json

import pytest

from trtqat.stages.export import _earlier_results


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "m-fp32.onnx").write_bytes(b"x")
    (tmp_path / "m-int8.onnx").write_bytes(b"x")
    earlier = [{"path": "elsewhere/m-fp32.onnx", "variant": "fp32", "checkpoint": "a.pt"},
               {"path": "elsewhere/m-int8.onnx", "variant": "int8", "checkpoint": "a.pt"},
               {"path": "elsewhere/gone.onnx", "variant": "fp16", "checkpoint": "a.pt"}]
    (tmp_path / "export.json").write_text(json.dumps({"results": earlier}))
    return tmp_path


def test_earlier_records_of_other_files_are_kept(folder):
    new = [{"path": str(folder / "m-int8.onnx"), "variant": "int8", "checkpoint": "b.pt"}]
    kept = _earlier_results(folder / "export.json", new)
    # fp32 is kept; int8 is replaced by the new record; gone.onnx no longer exists
    assert [r["variant"] for r in kept] == ["fp32"]


def test_unreadable_summary_keeps_nothing(tmp_path):
    (tmp_path / "export.json").write_bytes(b"\x00garbage")
    assert _earlier_results(tmp_path / "export.json", []) == []
    assert _earlier_results(tmp_path / "missing.json", []) == []
