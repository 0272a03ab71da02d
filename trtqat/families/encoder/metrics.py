"""Embedding fidelity: how close a quantized encoder's sentence embeddings stay to FP32.

* mean cosine: the average, over sentences, of cos(FP32 embedding, INT8 embedding);
* Spearman: the rank correlation between the two models' pairwise cosine-similarity
  matrices (upper triangles, diagonal excluded), i.e. whether the quantized model still
  orders sentence pairs by similarity the way the FP32 model does.
"""

from __future__ import annotations

import numpy as np
import torch

from trtqat.arrays import row_cosines


def _as_array(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


def _check_pair(ref: np.ndarray, test: np.ndarray) -> None:
    if ref.ndim != 2 or ref.shape != test.shape:
        raise ValueError(f"embeddings must be two (sentences, dim) arrays of one shape, got "
                         f"{ref.shape} and {test.shape}")
    if len(ref) == 0:
        raise ValueError("no embeddings to compare")


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def cosine_per_sentence(ref, test) -> np.ndarray:
    """cos(ref[i], test[i]) for every row ``i`` (:func:`trtqat.arrays.row_cosines`)."""
    ref, test = _as_array(ref), _as_array(test)
    _check_pair(ref, test)
    return row_cosines(ref, test)


def mean_cosine(ref, test) -> float:
    """Mean over sentences of the cosine between two models' embeddings."""
    return float(cosine_per_sentence(ref, test).mean())


def similarity_upper(emb) -> np.ndarray:
    """The pairwise cosine similarities of ``emb``'s rows, upper triangle without diagonal."""
    e = _unit(_as_array(emb))
    rows, cols = np.triu_indices(len(e), k=1)
    return (e @ e.T)[rows, cols]


def rankdata(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n, ties sharing their average rank (scipy's ``rankdata`` 'average')."""
    x = np.asarray(x).ravel()
    sorter = np.argsort(x, kind="mergesort")
    inv = np.empty(len(x), dtype=np.intp)
    inv[sorter] = np.arange(len(x))
    xs = x[sorter]
    first = np.r_[True, xs[1:] != xs[:-1]]
    dense = first.cumsum()[inv]
    bounds = np.r_[np.nonzero(first)[0], len(x)]
    return 0.5 * (bounds[dense] + bounds[dense - 1] + 1)


def spearman(x, y) -> float:
    """Spearman rank correlation of two equally long 1-D samples (NaN if one is constant)."""
    x, y = _as_array(x).ravel(), _as_array(y).ravel()
    if x.shape != y.shape or len(x) < 2:
        raise ValueError(f"spearman needs two samples of one length >= 2, got {x.shape}, {y.shape}")
    rx, ry = rankdata(x) - (len(x) + 1) / 2, rankdata(y) - (len(y) + 1) / 2
    den = np.sqrt((rx * rx).sum() * (ry * ry).sum())
    return float((rx * ry).sum() / den) if den > 0 else float("nan")


def similarity_spearman(ref, test) -> float:
    """Spearman correlation between the pairwise similarity matrices of two embedding sets."""
    ref, test = _as_array(ref), _as_array(test)
    _check_pair(ref, test)
    if len(ref) < 3:
        raise ValueError("similarity_spearman needs at least 3 sentences (2 pairs)")
    return spearman(similarity_upper(ref), similarity_upper(test))


def embedding_fidelity(ref, test) -> dict[str, float]:
    """``mean_cosine``, ``min_cosine``, ``spearman`` and ``sentences`` of ``test`` vs ``ref``."""
    cos = cosine_per_sentence(ref, test)
    out = {"mean_cosine": float(cos.mean()), "min_cosine": float(cos.min()),
           "sentences": int(len(cos))}
    out["spearman"] = similarity_spearman(ref, test) if len(cos) >= 3 else float("nan")
    return out
