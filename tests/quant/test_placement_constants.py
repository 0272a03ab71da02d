"""A forward that makes a tensor (``torch.tensor(...)``, an index table) traces into an fx
constant (``_tensor_constantN``); the placed forward must still find it (timm's Swin
``WindowAttention`` crashed at ``trtqat.quantize`` with "no attribute '_tensor_constant0'")."""

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
