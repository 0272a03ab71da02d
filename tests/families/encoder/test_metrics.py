"""Embedding-fidelity metrics against independent numpy/scipy references."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import rankdata as scipy_rankdata
from scipy.stats import spearmanr

from trtqat.families.encoder.metrics import (
    embedding_fidelity,
    mean_cosine,
    rankdata,
    similarity_spearman,
    spearman,
)


def test_rankdata_matches_scipy_with_ties():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 7, size=200).astype(float)
    np.testing.assert_array_equal(rankdata(x), scipy_rankdata(x))


def test_spearman_matches_scipy():
    rng = np.random.default_rng(1)
    x = rng.standard_normal(300)
    y = x + rng.standard_normal(300)
    y[:20] = np.round(y[:20])  # some ties
    assert spearman(x, y) == pytest.approx(spearmanr(x, y).statistic, abs=1e-12)
    assert np.isnan(spearman(np.ones(5), np.arange(5.0)))


def test_similarity_spearman_and_cosine_against_references():
    rng = np.random.default_rng(2)
    ref = rng.standard_normal((40, 16))
    test = ref + 0.3 * rng.standard_normal((40, 16))
    unit = lambda e: e / np.linalg.norm(e, axis=1, keepdims=True)  # noqa: E731
    iu = np.triu_indices(40, k=1)
    want = spearmanr((unit(ref) @ unit(ref).T)[iu], (unit(test) @ unit(test).T)[iu]).statistic
    assert similarity_spearman(ref, test) == pytest.approx(want, abs=1e-12)
    cos = [a @ b / np.linalg.norm(a) / np.linalg.norm(b) for a, b in zip(ref, test)]
    assert mean_cosine(torch.from_numpy(ref).float(), torch.from_numpy(test).float()) == \
        pytest.approx(np.mean(cos), abs=1e-6)


def test_identical_embeddings_are_perfect():
    e = torch.randn(10, 8)
    fid = embedding_fidelity(e, e.clone())
    assert fid["mean_cosine"] == pytest.approx(1.0)
    assert fid["min_cosine"] == pytest.approx(1.0)
    assert fid["spearman"] == pytest.approx(1.0)
    assert fid["sentences"] == 10


def test_shape_mismatch_is_refused():
    with pytest.raises(ValueError, match="one shape"):
        mean_cosine(np.zeros((3, 4)), np.zeros((3, 5)))
