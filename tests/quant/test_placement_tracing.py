"""Tracing cases models from outside hit.

* A forward that makes a tensor (``torch.tensor(...)``, an index table) traces into an fx
  constant (``_tensor_constantN``); the placed forward must still find it (timm's Swin
  ``WindowAttention`` crashed at ``trtqat.quantize``: "no attribute '_tensor_constant0'").
* A ModuleList item called as ``self.down[0].forward(y)`` (HRNet) is inlined into its
  parent's trace; tracing the item again counted its layers twice, so their BatchNorms were
  "called more than once" and stayed unfolded."""

from __future__ import annotations

import copy

import torch
from torch import nn

import trtqat


class _MadeTensor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gain = torch.tensor([0.5, 2.0]).repeat(4)  # made here: an fx tensor constant
        return self.fc(x) * gain + x


def test_a_tensor_made_in_forward_survives_placement(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(_MadeTensor(), nn.Linear(8, 4)).eval()
    x = torch.randn(4, 8)
    ref = model(x)
    trtqat.quantize(model, forward_loop=[x])
    y = model(x)
    assert torch.allclose(y, ref, atol=0.1)
    # kept as a non-persistent buffer: copies keep it, the state dict does not carry it
    assert any("_tensor_constant" in n for n, _ in model.named_buffers())
    assert not any("_tensor_constant" in k for k in model.state_dict())
    assert torch.equal(copy.deepcopy(model)(x), y)
    result = trtqat.export_onnx(model, x[:2], tmp_path / "m-int8.onnx")
    assert result.path.exists()


class _ForwardCalled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.down = nn.ModuleList([nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4),
                                                 nn.ReLU())])
        self.head = nn.Conv2d(4, 2, 1)

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return self.head(self.down[0].forward(y))


def test_a_list_item_called_through_forward_is_counted_once(tmp_path):
    import onnx

    from trtqat.quant.placement.flow import ModelFlow

    flow = ModelFlow(_ForwardCalled())
    assert {k: len(v) for k, v in flow.sites.items() if k.startswith("down")} == {
        "down.0.0": 1, "down.0.1": 1, "down.0.2": 1}
    torch.manual_seed(0)
    model = _ForwardCalled().eval()
    x = torch.randn(2, 3, 12, 12)
    trtqat.quantize(model, forward_loop=[x])
    path = trtqat.export_onnx(model, x[:1], tmp_path / "m-int8.onnx").path
    ops = {n.op_type for n in onnx.load(path).graph.node}
    assert "BatchNormalization" not in ops and "ConvInteger" not in ops and "Conv" in ops
