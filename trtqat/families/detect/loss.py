"""The detection family's loss for anchor-free heads (the built-in detector and user
detectors that return raw outputs in training): task-aligned assignment, BCE on IoU-aware
class targets, GIoU on boxes; and the distillation loss from an FP32 teacher.

Raw outputs are ``(B, 4 + C, A)``: box distances left, top, right, bottom (before softplus,
in strides of the anchor's level) and class logits (see :mod:`.yolo`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from trtqat.families.detect.yolo import make_anchors

TOPK = 10
ALPHA, BETA = 0.5, 6.0  # score^alpha * IoU^beta: the task-aligned metric
BOX_GAIN, CLS_GAIN = 5.0, 1.0


def pairwise_iou(a: torch.Tensor, b: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """IoU of ``a`` (..., M, 4) with ``b`` (..., A, 4), xyxy: (..., M, A)."""
    lt = torch.maximum(a[..., :, None, :2], b[..., None, :, :2])
    rb = torch.minimum(a[..., :, None, 2:], b[..., None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    area_a = (a[..., 2:] - a[..., :2]).clamp(min=0).prod(-1)
    area_b = (b[..., 2:] - b[..., :2]).clamp(min=0).prod(-1)
    return inter / (area_a[..., :, None] + area_b[..., None, :] - inter + eps)


def giou(a: torch.Tensor, b: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """Generalized IoU of matched boxes ``a``, ``b`` (N, 4), xyxy."""
    lt, rb = torch.maximum(a[:, :2], b[:, :2]), torch.minimum(a[:, 2:], b[:, 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    union = (a[:, 2:] - a[:, :2]).prod(-1) + (b[:, 2:] - b[:, :2]).prod(-1) - inter + eps
    hull = (torch.maximum(a[:, 2:], b[:, 2:]) - torch.minimum(a[:, :2], b[:, :2])).prod(-1)
    return inter / union - (hull - union) / (hull + eps)


def padded_targets(targets: Sequence[torch.Tensor], device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(B, M, 5)`` targets (zero rows after each image's own) and their ``(B, M)`` mask."""
    m = max([len(t) for t in targets] + [1])
    out = torch.zeros(len(targets), m, 5, device=device)
    mask = torch.zeros(len(targets), m, dtype=torch.bool, device=device)
    for i, t in enumerate(targets):
        out[i, :len(t)] = t.to(device)
        mask[i, :len(t)] = True
    return out, mask


class DetectionLoss(nn.Module):
    """Task-aligned assignment (top-k anchors per object by score^0.5 x IoU^6 among those
    inside its box), then BCE on IoU-aware class targets and GIoU on the boxes.

    ``strides``: the head's level strides; the feature sizes follow from the input size.
    """

    def __init__(self, strides: Sequence[int], num_classes: int) -> None:
        super().__init__()
        self.strides, self.num_classes = tuple(strides), num_classes

    def anchors(self, image_hw: tuple[int, int], device, dtype=torch.float32):
        shapes = [(-(-image_hw[0] // s), -(-image_hw[1] // s)) for s in self.strides]
        return make_anchors(shapes, self.strides, device, dtype)

    def forward(self, raw: torch.Tensor, targets: Sequence[torch.Tensor],
                image_hw: tuple[int, int]) -> torch.Tensor:
        points, steps = self.anchors(image_hw, raw.device)
        dist = F.softplus(raw[:, :4].transpose(1, 2).float()) * steps  # (B, A, 4)
        boxes = torch.cat((points - dist[..., :2], points + dist[..., 2:]), -1)
        logits = raw[:, 4:].transpose(1, 2).float()  # (B, A, C)
        gt, mask = padded_targets(targets, raw.device)
        with torch.no_grad():
            fg, gt_idx, weight = self._assign(boxes.detach(), logits.detach().sigmoid(),
                                              points, steps, gt, mask)
        b_idx = torch.arange(len(gt), device=raw.device)[:, None].expand_as(gt_idx)
        matched = gt[b_idx, gt_idx]  # (B, A, 5)
        target_scores = torch.zeros_like(logits)
        cls = matched[..., 0].long().clamp(0, self.num_classes - 1)
        target_scores.scatter_(2, cls[..., None], (weight * fg)[..., None])
        norm = target_scores.sum().clamp(min=1.0)
        cls_loss = F.binary_cross_entropy_with_logits(logits, target_scores,
                                                      reduction="sum") / norm
        if fg.any():
            g = giou(boxes[fg], matched[fg][:, 1:])
            box_loss = ((1.0 - g) * weight[fg]).sum() / norm
        else:
            box_loss = boxes.sum() * 0.0
        return BOX_GAIN * box_loss + CLS_GAIN * cls_loss

    def _assign(self, boxes, scores, points, steps, gt, mask):
        """``(fg (B, A), gt index (B, A), target weight (B, A))``."""
        b, m = gt.shape[:2]
        gt_boxes = gt[..., 1:]
        iou = pairwise_iou(gt_boxes, boxes)  # (B, M, A)
        cls = gt[..., 0].long().clamp(0, self.num_classes - 1)
        score = scores.transpose(1, 2).gather(1, cls[..., None].expand(-1, -1, scores.shape[1]))
        p = points[None, None]  # (1, 1, A, 2)
        inside = ((p >= gt_boxes[..., None, :2] - 1) & (p <= gt_boxes[..., None, 2:] + 1)).all(-1)
        centre = (gt_boxes[..., :2] + gt_boxes[..., 2:]) / 2
        near = (p - centre[..., None, :]).abs().amax(-1) < steps.T[None]  # (B, M, A)
        cand = (inside | near) & mask[..., None]
        align = score.pow(ALPHA) * iou.pow(BETA) * cand
        k = min(TOPK, align.shape[-1])
        top = align.topk(k, dim=-1).indices
        chosen = torch.zeros_like(cand).scatter_(-1, top, True) & cand
        many = chosen.sum(1) > 1  # an anchor chosen by several objects: the best IoU wins
        if many.any():
            best = (iou * chosen).argmax(1)  # (B, A)
            one = F.one_hot(best, m).transpose(1, 2).bool()
            chosen = torch.where(many[:, None], one & chosen, chosen)
        fg = chosen.any(1)
        gt_idx = chosen.float().argmax(1)
        align = align * chosen
        norm_align = align / align.amax(-1, keepdim=True).clamp(min=1e-9) * (
            iou * chosen).amax(-1, keepdim=True)
        weight = norm_align.amax(1)  # (B, A)
        return fg, gt_idx, weight


def distill_loss(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """The student's raw ``(B, 4 + C, A)`` outputs against the FP32 teacher's: BCE of the
    class logits on the teacher's scores, L1 of the box distances (in strides)."""
    cls = F.binary_cross_entropy_with_logits(student[:, 4:], teacher[:, 4:].sigmoid())
    box = F.l1_loss(F.softplus(student[:, :4]), F.softplus(teacher[:, :4]))
    return cls + box
