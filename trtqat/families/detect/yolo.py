"""``yolo_digits``: a small YOLO-style detector, the built-in model of the detection family.

It has what TensorRT's Q/DQ placement cares about in real YOLO models: Conv-BN-activation
blocks, residual Adds (bottlenecks), a C2f-like split/concat, an SPPF-like chain of
MaxPools, an upsample + concat neck (FPN and PAN) and an anchor-free decoupled head.

It is built for INT8 on CPUs too (``benchmarks/detect_speed.py``): its activation is ReLU,
which an integer conv folds into its requantization in TensorRT and ONNX Runtime (SiLU,
Ultralytics' choice, costs ONNX Runtime's CPU kernels an integer Sigmoid and Mul after each
conv), and no conv after the stem reads fewer than 16 channels (without VNNI, ONNX
Runtime's exact integer convs beat float ones only from about 16 input channels). The
earlier model (SiLU, widths 16, 32, 64, 96: ``act="silu"``, :data:`LEGACY_WIDTHS`) had an
INT8 engine slower than its FP32 one; checkpoints that do not record their activation and
widths are rebuilt with it.

Outputs (the same layout as Ultralytics' YOLOv8/11 heads):

* eval: ``(batch, 4 + classes, anchors)``: box centre x, y, width, height in input pixels,
  then per-class scores in [0, 1] (sigmoid);
* train: the raw ``(batch, 4 + classes, anchors)``: box distances (left, top, right,
  bottom; before softplus, in strides) and class logits, which :mod:`.loss` consumes.

The final prediction convs (``head.box.<i>`` and ``head.cls.<i>``: :data:`FLOAT_LAYERS`)
stay in float by the family's default, as Ultralytics' own QAT keeps them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

STRIDES = (8, 16, 32)
WIDTHS = (32, 48, 64, 96)  # channels at strides 2/4, 8, 16, 32
ACTIVATIONS = {"relu": nn.ReLU, "silu": nn.SiLU}
DEFAULT_ACT = "relu"
# the earlier model's, rebuilt for checkpoints that do not record theirs
LEGACY_WIDTHS, LEGACY_ACT = (16, 32, 64, 96), "silu"
FLOAT_LAYERS = ("head.box.*", "head.cls.*")  # the final prediction convs


class ConvBNAct(nn.Module):
    """Conv (no bias) -> BatchNorm -> activation (:data:`ACTIVATIONS`)."""

    def __init__(self, cin: int, cout: int, k: int = 3, s: int = 1, act: str = DEFAULT_ACT
                 ) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, s, k // 2, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.act = ACTIVATIONS[act]()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class Bottleneck(nn.Module):
    """Two 3x3 convs and a residual Add."""

    def __init__(self, c: int, act: str = DEFAULT_ACT) -> None:
        super().__init__()
        self.cv1 = ConvBNAct(c, c, 3, act=act)
        self.cv2 = ConvBNAct(c, c, 3, act=act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.cv2(self.cv1(x))


class C2f(nn.Module):
    """1x1 conv, split in two halves, bottlenecks on the second, concat all, 1x1 conv."""

    def __init__(self, cin: int, cout: int, n: int = 1, shortcut: bool = True,
                 act: str = DEFAULT_ACT) -> None:
        super().__init__()
        self.c = c = cout // 2
        self.cv1 = ConvBNAct(cin, 2 * c, 1, act=act)
        self.cv2 = ConvBNAct((2 + n) * c, cout, 1, act=act)
        self.m = nn.ModuleList(Bottleneck(c, act) if shortcut else
                               nn.Sequential(ConvBNAct(c, c, act=act), ConvBNAct(c, c, act=act))
                               for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = list(self.cv1(x).chunk(2, 1))
        for m in self.m:
            y.append(m(y[-1]))
        return self.cv2(torch.cat(y, 1))


class SPPF(nn.Module):
    """1x1 conv, three chained 5x5 MaxPools, concat, 1x1 conv."""

    def __init__(self, cin: int, cout: int, act: str = DEFAULT_ACT) -> None:
        super().__init__()
        c = cin // 2
        self.cv1 = ConvBNAct(cin, c, 1, act=act)
        self.cv2 = ConvBNAct(4 * c, cout, 1, act=act)
        self.pool = nn.MaxPool2d(5, 1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = [self.cv1(x)]
        for _ in range(3):
            y.append(self.pool(y[-1]))
        return self.cv2(torch.cat(y, 1))


def make_anchors(shapes: list[tuple[int, int]], strides: tuple[int, ...], device=None,
                 dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Anchor centres ``(A, 2)`` in pixels and their strides ``(A, 1)`` for feature maps of
    ``shapes`` (h, w) at ``strides``."""
    points, steps = [], []
    for (h, w), s in zip(shapes, strides):
        ys = (torch.arange(h, device=device, dtype=dtype) + 0.5) * s
        xs = (torch.arange(w, device=device, dtype=dtype) + 0.5) * s
        gy, gx = torch.meshgrid(ys, xs, indexing="ij")
        points.append(torch.stack((gx, gy), -1).reshape(-1, 2))
        steps.append(torch.full((h * w, 1), float(s), device=device, dtype=dtype))
    return torch.cat(points), torch.cat(steps)


def decode(raw: torch.Tensor, points: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """Raw ``(B, 4 + C, A)`` -> boxes (cx, cy, w, h in pixels) and sigmoid scores."""
    dist = F.softplus(raw[:, :4]) * steps.T  # (B, 4, A) left, top, right, bottom in pixels
    lt, rb = dist[:, :2], dist[:, 2:]
    p = points.T.unsqueeze(0)
    centre = p + (rb - lt) / 2
    size = lt + rb
    return torch.cat((centre, size, raw[:, 4:].sigmoid()), 1)


@torch.fx.wrap
def detections(raw: torch.Tensor, feats: list[torch.Tensor], strides: tuple[int, ...]
               ) -> torch.Tensor:
    """Raw head outputs -> boxes and scores, anchors from the feature maps' sizes (one
    call in a traced graph: its shape arithmetic stays out of placement's FX traces)."""
    points, steps = make_anchors([tuple(f.shape[2:]) for f in feats], strides, raw.device,
                                 raw.dtype)
    return decode(raw, points, steps)


class Head(nn.Module):
    """Decoupled anchor-free head: per level a box branch and a class branch (two 3x3
    Conv-BN-activation each) ending in a 1x1 prediction conv (``box.<i>``, ``cls.<i>``)."""

    def __init__(self, channels: tuple[int, ...], num_classes: int, act: str = DEFAULT_ACT
                 ) -> None:
        super().__init__()
        self.num_classes = num_classes
        cb, cc = max(16, channels[0] // 2), max(channels[0], num_classes)
        self.box_stem = nn.ModuleList(
            nn.Sequential(ConvBNAct(c, cb, act=act), ConvBNAct(cb, cb, act=act))
            for c in channels)
        self.cls_stem = nn.ModuleList(
            nn.Sequential(ConvBNAct(c, cc, act=act), ConvBNAct(cc, cc, act=act))
            for c in channels)
        self.box = nn.ModuleList(nn.Conv2d(cb, 4, 1) for _ in channels)
        self.cls = nn.ModuleList(nn.Conv2d(cc, num_classes, 1) for _ in channels)
        for conv in self.cls:  # a low prior: few anchors hold an object
            nn.init.constant_(conv.bias, -4.0)

    def forward(self, feats: list[torch.Tensor]) -> torch.Tensor:
        outs = []
        for i, f in enumerate(feats):
            box = self.box[i](self.box_stem[i](f))
            cls = self.cls[i](self.cls_stem[i](f))
            outs.append(torch.cat((box, cls), 1).flatten(2))
        return torch.cat(outs, 2)


class YoloDigits(nn.Module):
    """A small YOLOv8-style detector (backbone, FPN+PAN neck, decoupled head)."""

    strides = STRIDES
    trtqat_float_layers = FLOAT_LAYERS  # trtqat.quantize keeps them float too

    def __init__(self, num_classes: int = 10, widths: tuple[int, ...] = WIDTHS,
                 act: str = DEFAULT_ACT) -> None:
        super().__init__()
        if act not in ACTIVATIONS:
            raise ValueError(f"unknown activation {act!r}: use one of {sorted(ACTIVATIONS)}")
        c1, c2, c3, c4 = widths
        self.num_classes, self.widths, self.act = num_classes, tuple(widths), act
        self.stem = ConvBNAct(3, c1, 3, 2, act)                                   # /2
        self.stage1 = nn.Sequential(ConvBNAct(c1, c1, 3, 2, act), C2f(c1, c1, act=act))  # /4
        self.stage2 = nn.Sequential(ConvBNAct(c1, c2, 3, 2, act), C2f(c2, c2, act=act))  # /8
        self.stage3 = nn.Sequential(ConvBNAct(c2, c3, 3, 2, act), C2f(c3, c3, act=act))  # /16
        self.stage4 = nn.Sequential(ConvBNAct(c3, c4, 3, 2, act), C2f(c4, c4, act=act),
                                    SPPF(c4, c4, act))                             # /32
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.top4 = C2f(c4 + c3, c3, shortcut=False, act=act)    # P4 (FPN)
        self.top3 = C2f(c3 + c2, c2, shortcut=False, act=act)    # P3 out
        self.down3 = ConvBNAct(c2, c2, 3, 2, act)
        self.pan4 = C2f(c2 + c3, c3, shortcut=False, act=act)    # P4 out
        self.down4 = ConvBNAct(c3, c3, 3, 2, act)
        self.pan5 = C2f(c3 + c4, c4, shortcut=False, act=act)    # P5 out
        self.head = Head((c2, c3, c4), num_classes, act)

    def features(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The three neck outputs at strides 8, 16, 32."""
        p3 = self.stage2(self.stage1(self.stem(x)))
        p4 = self.stage3(p3)
        p5 = self.stage4(p4)
        t4 = self.top4(torch.cat((self.up(p5), p4), 1))
        n3 = self.top3(torch.cat((self.up(t4), p3), 1))
        n4 = self.pan4(torch.cat((self.down3(n3), t4), 1))
        n5 = self.pan5(torch.cat((self.down4(n4), p5), 1))
        return [n3, n4, n5]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats = self.features(x)
        raw = self.head(feats)
        if self.training:
            return raw
        return detections(raw, feats, self.strides)


def yolo_digits(num_classes: int = 10, widths: tuple[int, ...] = WIDTHS,
                act: str = DEFAULT_ACT) -> YoloDigits:
    """The built-in detector (``--model yolo_digits``), randomly initialised."""
    return YoloDigits(num_classes, tuple(widths), act)
