"""One catalogue of tiny test models, each a user model the Q/DQ placement must handle.

Every factory takes ``num_classes`` (so ``path/to/catalogue.py:NAME`` works as ``--model``)
and builds a model for 3 x 16 x 16 images (any size that halves twice works). Names:

* ``residual``: conv-bn-relu blocks with an identity shortcut (residual Add).
* ``concat_upsample``: two branches, one pooled and upsampled, concatenated before a conv.
* ``maxpool``: a stem with a MaxPool before the residual blocks.
* ``se``: an inverted residual with a squeeze-and-excitation gate.
* ``groupnorm``: residual blocks normalised with GroupNorm.
* ``two_heads``: a classifier and an auxiliary head, returned as a tuple.
* ``dict_heads``: the same heads returned as a dict.
* ``unused_head``: a head that is built but never called.
* ``mha``: patch embedding, then ``nn.MultiheadAttention`` self-attention and an MLP.
* ``sdpa``: an attention block written with ``F.scaled_dot_product_attention``.
* ``matmul_attention``: attention written with ``q @ k.transpose(-2, -1)``, softmax, ``@ v``.
* ``untraceable``: a residual block whose forward branches on the data (FX cannot trace it).
* ``bnact``: timm's ``BatchNormAct2d`` after each conv (needs timm).

:class:`SmallNet` is the smallest CNN of the pytorch-quantization compatibility tests.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def conv_bn(cin: int, cout: int, stride: int = 1, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, groups=groups, bias=False),
                         nn.BatchNorm2d(cout))


class Block(nn.Module):
    """conv-bn-relu-conv-bn plus the identity, then ReLU."""

    def __init__(self, width: int, norm: str = "bn") -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.norm1 = nn.BatchNorm2d(width) if norm == "bn" else nn.GroupNorm(2, width)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.norm2 = nn.BatchNorm2d(width) if norm == "bn" else nn.GroupNorm(2, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return F.relu(out + x)


class Classifier(nn.Module):
    """stem -> body -> global average pool -> linear."""

    def __init__(self, body: nn.Module, width: int, num_classes: int, pool: bool = False
                 ) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 2, 1, bias=False),
                                  nn.BatchNorm2d(width), nn.ReLU())
        self.pool = nn.MaxPool2d(2) if pool else nn.Identity()
        self.body = body
        self.head = nn.Linear(width, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(self.pool(self.stem(x))).mean((2, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def residual(num_classes: int = 10) -> nn.Module:
    return Classifier(nn.Sequential(Block(8), Block(8)), 8, num_classes)


def maxpool(num_classes: int = 10) -> nn.Module:
    return Classifier(nn.Sequential(Block(8)), 8, num_classes, pool=True)


def groupnorm(num_classes: int = 10) -> nn.Module:
    return Classifier(nn.Sequential(Block(8, "gn"), Block(8, "gn")), 8, num_classes)


class ConcatUpsample(nn.Module):
    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(conv_bn(3, 8, 2), nn.ReLU())
        self.down = nn.Sequential(nn.MaxPool2d(2), conv_bn(8, 8), nn.ReLU())
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.fuse = nn.Sequential(conv_bn(16, 8), nn.ReLU())
        self.head = nn.Linear(8, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        y = torch.cat([x, self.up(self.down(x))], dim=1)
        return self.head(self.fuse(y).mean((2, 3)))


def concat_upsample(num_classes: int = 10) -> nn.Module:
    return ConcatUpsample(num_classes)


class SqueezeExcite(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.reduce = nn.Conv2d(width, width // 2, 1)
        self.expand = nn.Conv2d(width // 2, width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.mean((2, 3), keepdim=True)
        return x * torch.sigmoid(self.expand(F.relu(self.reduce(s))))


class InvertedResidualSE(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.expand = nn.Sequential(nn.Conv2d(width, 2 * width, 1, bias=False),
                                    nn.BatchNorm2d(2 * width), nn.ReLU6())
        self.dw = nn.Sequential(conv_bn(2 * width, 2 * width, groups=2 * width), nn.ReLU6())
        self.se = SqueezeExcite(2 * width)
        self.project = nn.Sequential(nn.Conv2d(2 * width, width, 1, bias=False),
                                     nn.BatchNorm2d(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.project(self.se(self.dw(self.expand(x))))


def se(num_classes: int = 10) -> nn.Module:
    return Classifier(nn.Sequential(InvertedResidualSE(8), InvertedResidualSE(8)), 8,
                      num_classes)


class TwoHeads(nn.Module):
    def __init__(self, num_classes: int, as_dict: bool = False, use_aux: bool = True) -> None:
        super().__init__()
        self.trunk = Classifier(nn.Sequential(Block(8)), 8, num_classes)
        self.aux = nn.Linear(8, 3)
        self.as_dict, self.use_aux = as_dict, use_aux

    def forward(self, x: torch.Tensor):
        f = self.trunk.features(x)
        logits = self.trunk.head(f)
        if not self.use_aux:
            return logits
        aux = self.aux(f)
        return {"logits": logits, "aux": aux} if self.as_dict else (logits, aux)


def two_heads(num_classes: int = 10) -> nn.Module:
    return TwoHeads(num_classes)


def dict_heads(num_classes: int = 10) -> nn.Module:
    return TwoHeads(num_classes, as_dict=True)


def unused_head(num_classes: int = 10) -> nn.Module:
    return TwoHeads(num_classes, use_aux=False)


class PatchAttention(nn.Module):
    """Patches -> (pre-LN) self-attention block -> MLP block -> mean -> linear."""

    def __init__(self, num_classes: int, dim: int = 16, kind: str = "mha") -> None:
        super().__init__()
        self.embed = nn.Conv2d(3, dim, 4, 4)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.kind, self.heads = kind, 2
        if kind == "mha":
            self.attn = nn.MultiheadAttention(dim, 2, batch_first=True)
        else:
            self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.head = nn.Linear(dim, num_classes)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "mha":
            return self.attn(x, x, x, need_weights=False)[0]
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(
            2, 0, 3, 1, 4).unbind(0)
        if self.kind == "sdpa":
            out = F.scaled_dot_product_attention(q, k, v)
        else:
            weights = (q @ k.transpose(-2, -1)) * (c // self.heads) ** -0.5
            out = weights.softmax(dim=-1) @ v
        return self.proj(out.transpose(1, 2).reshape(b, n, c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x).flatten(2).transpose(1, 2)
        x = x + self.attention(self.norm1(x))
        x = x + self.mlp(self.norm2(x))
        return self.head(x.mean(1))


def mha(num_classes: int = 10) -> nn.Module:
    return PatchAttention(num_classes, kind="mha")


def sdpa(num_classes: int = 10) -> nn.Module:
    return PatchAttention(num_classes, kind="sdpa")


def matmul_attention(num_classes: int = 10) -> nn.Module:
    return PatchAttention(num_classes, kind="matmul")


class Branchy(Block):
    """A residual block whose forward branches on the input's size: FX cannot trace it
    (torch.export can, the size being static)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.norm2(self.conv2(F.relu(self.norm1(self.conv1(x)))))
        if x.shape[-1] > 2:
            return F.relu(out + x)
        return F.relu(out)


def untraceable(num_classes: int = 10) -> nn.Module:
    return Classifier(nn.Sequential(Branchy(8), Block(8)), 8, num_classes)


def bnact(num_classes: int = 10) -> nn.Module:
    from timm.layers import BatchNormAct2d

    model = Classifier(nn.Sequential(Block(8)), 8, num_classes)
    model.stem[1] = BatchNormAct2d(8, act_layer=nn.ReLU)
    model.stem[2] = nn.Identity()
    return model


class SmallNet(nn.Module):
    """conv -> ReLU -> pool -> fc (3 -> 4 -> 3 classes): the smallest CNN, as
    pytorch-quantization programs build one, e.g. under ``quant_modules.initialize()``.
    Not in :data:`CATALOGUE` (it has no rule of its own to place)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.relu = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.relu(self.conv(x))), 1))


CATALOGUE = ("residual", "concat_upsample", "maxpool", "se", "groupnorm", "two_heads",
             "dict_heads", "unused_head", "mha", "sdpa", "matmul_attention", "untraceable",
             "bnact")


def build(name: str, num_classes: int = 10) -> nn.Module:
    """A catalogue model by name, with random weights and settled BatchNorm statistics."""
    torch.manual_seed(0)
    model = globals()[name](num_classes)
    settle(model)
    return model.eval()


@torch.no_grad()
def settle(model: nn.Module, size: int = 16) -> None:
    """BatchNorm statistics from random images, and random BatchNorm affine parameters, so
    folding them changes the conv weights."""
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.momentum = None
            nn.init.uniform_(m.weight, 0.5, 1.5)
            nn.init.uniform_(m.bias, -0.2, 0.2)
    model.train()
    gen = torch.Generator().manual_seed(1)
    for _ in range(2):
        model(torch.randn(4, 3, size, size, generator=gen))
    model.eval()


def images(n: int = 2, batch: int = 4, size: int = 16, seed: int = 0) -> list[torch.Tensor]:
    """``n`` reproducible random image batches."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, 3, size, size, generator=gen) for _ in range(n)]
