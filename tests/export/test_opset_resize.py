"""An upsample (Resize) beside a split exports at the default opset 17: the converter
leaves opset 18's default Resize attributes behind, which opset 17 does not know."""

from __future__ import annotations

import onnx
import torch
from torch import nn

from trtqat.export import export_onnx


class SplitUp(nn.Module):
    """A channel split and an upsample (as in YOLO necks): the pair that broke opset 17."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.up = nn.Upsample(scale_factor=2)
        self.out = nn.Conv2d(4, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.conv(x).chunk(2, 1)
        return self.out(self.up(torch.cat((a, b * 2), 1)))


def test_upsample_exports_at_opset_17(tmp_path) -> None:
    model = SplitUp().eval()
    result = export_onnx(model, torch.rand(2, 3, 8, 8), tmp_path / "m.onnx", variant="fp32",
                         opset=17)
    assert result.passed and result.opset == 17
    resize = [n for n in onnx.load(str(tmp_path / "m.onnx")).graph.node
              if n.op_type == "Resize"]
    assert resize and not {a.name for a in resize[0].attribute} & {
        "antialias", "keep_aspect_ratio_policy"}
