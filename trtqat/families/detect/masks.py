"""The masks of a segmentation head, as its export check compares them.

A Segment head's file gives per anchor mask coefficients (``output0``, after the class
scores) and per image protos (``output1``, ``(nm, H/4, W/4)``); an instance's mask is
``sigmoid(coefficients x protos)``. The check builds the masks of the anchors the reference
keeps (best class score >= 0.25; the most confident anchors where it keeps none) from each
side's own coefficients and protos: a small error in either shows in the masks.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from trtqat.families.detect.heads import Head

KEPT_SCORE = 0.25     # the anchors a deployment keeps
MOST_CONFIDENT = 8    # per image, where the reference keeps none
MAX_ANCHORS = 100     # per image, the most confident kept ones


def anchors(output0: np.ndarray, head: Head) -> np.ndarray:
    """Indices of the anchors whose masks are compared, of one image's ``(C, A)``."""
    best = output0[4:head.score_stop(output0.shape[0])].max(0)
    order = np.argsort(-best, kind="stable")
    kept = int((best >= KEPT_SCORE).sum())
    return order[:min(kept, MAX_ANCHORS) if kept else MOST_CONFIDENT]


def masks(output0: np.ndarray, protos: np.ndarray, head: Head, index: np.ndarray
          ) -> np.ndarray:
    """``(len(index), h * w)`` mask probabilities of one image's anchors ``index``."""
    coef = output0[head.score_stop(output0.shape[0]):, index].astype(np.float64)
    logits = coef.T @ protos.reshape(protos.shape[0], -1).astype(np.float64)
    return 1.0 / (1.0 + np.exp(-np.clip(logits, -60, 60)))


def mask_pairs(reference: Sequence[Sequence[np.ndarray]],
               candidate: Sequence[Sequence[np.ndarray]], head: Head,
               noise: Sequence[Sequence[tuple[np.ndarray, np.ndarray]]] | None = None
               ) -> tuple[np.ndarray, np.ndarray, float | None]:
    """``(candidate masks, reference masks, rounding floor)`` of every image: the masks of
    the reference's anchors (see :func:`anchors`) from each side's outputs 0 and 1; the
    floor (INT8) is the mean difference of the masks of the float64 and float32 references
    (``noise``: per batch and output, as the export check measures it)."""
    gots, refs, floors = [], [], []
    for b, (ref, got) in enumerate(zip(reference, candidate)):
        for j in range(len(ref[0])):
            index = anchors(ref[0][j], head)
            refs.append(masks(ref[0][j], ref[1][j], head, index).reshape(-1))
            gots.append(masks(got[0][j], got[1][j], head, index).reshape(-1))
            if noise is not None and b < len(noise) and j < len(noise[b][0][0]):
                (a0, b0), (a1, b1) = noise[b][0], noise[b][1]
                floors.append(np.abs(masks(a0[j], a1[j], head, index)
                                     - masks(b0[j], b1[j], head, index)).reshape(-1))
    floor = np.concatenate(floors) if floors else None
    floor = floor[np.isfinite(floor)] if floor is not None else None
    return (np.concatenate(gots) if gots else np.zeros(0),
            np.concatenate(refs) if refs else np.zeros(0),
            float(floor.mean()) if floor is not None and floor.size else None)
