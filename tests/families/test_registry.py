"""The family registry finds a family by name, model, checkpoint and ONNX file."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from trtqat import families


def _onnx(inputs: list[str], family: str | None = None) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Identity", [inputs[0]], ["out"])], "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1]) for n in inputs],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph)
    if family:
        model.metadata_props.append(onnx.StringStringEntryProto(key=families.FAMILY_KEY,
                                                                value=family))
    return model


def test_onnx_metadata_names_the_family() -> None:
    assert families.of_onnx(_onnx(["input"], "vit")).name == "vit"
    assert families.of_onnx(_onnx(["input_ids", "attention_mask"], "encoder")).name == "encoder"


def test_onnx_without_metadata_is_claimed_by_its_inputs() -> None:
    assert families.of_onnx(_onnx(["input_ids", "attention_mask"])).name == "encoder"
    assert families.of_onnx(_onnx(["images"])).name == "cnn"
    assert families.of_onnx(_onnx(["images"], "no-such-family")).name == "cnn"


def test_names_and_unknown_family() -> None:
    assert families.names()[-1] == "cnn"  # the fallback claims last
    assert {"cnn", "encoder", "vit"} <= set(families.names())
    with pytest.raises(families.UnknownFamilyError, match="use one of"):
        families.get("detector")


def test_models_and_checkpoints_find_their_family() -> None:
    assert families.of_model("vit").name == "vit"
    assert families.of_model("vit_b_16").name == "vit"
    assert families.of_model("resnet18").name == "cnn"
    assert families.of_checkpoint({"model": {"family": "vit"}}).name == "vit"
    assert families.of_checkpoint({"model": {"family": "transformer"}}).name == "encoder"
    assert families.of_checkpoint({"model": {"arch": "resnet18"}}).name == "cnn"
