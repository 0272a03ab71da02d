"""The re-encoding's agreement check (trtqat.engines.ort_inspect.check_agreement): float ties
are not flips, real flips are; the centered cosine measures near-constant scores."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtqat.engines.ort_inspect import AgreementError, check_agreement, mean_centered_cosine


def _add(offset: np.ndarray) -> onnx.ModelProto:
    """y = x + offset on [n, len(offset)] scores."""
    width = offset.shape[-1]
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "c"], ["y"])], "add",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", width])],
        [numpy_helper.from_array(offset.astype(np.float32), "c")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_float_ties_are_not_flips():
    same = np.zeros(5)
    noise = np.array([0, 1, -1, 2, -2]) * 1e-9  # far below float32 resolution of 0.5
    feeds = [{"x": np.full((4, 5), 0.5, np.float32)}]  # every score tied
    result = check_agreement(_add(same), _add(noise), feeds, min_top1=1.0, threads=1)
    assert result["top1_agreement"] == 1.0


def test_a_real_flip_still_fails():
    feeds = [{"x": np.tile(np.array([0.5, 0.4, 0.0, 0.0, 0.0], np.float32), (4, 1))}]
    swap = np.array([0.0, 0.2, 0, 0, 0])  # class 1 overtakes class 0 by 0.1
    with pytest.raises(AgreementError, match="top-1 agreement 0.00%"):
        check_agreement(_add(np.zeros(5)), _add(swap), feeds, threads=1)


def test_centered_cosine_sees_the_shape_of_near_constant_scores():
    rng = np.random.default_rng(0)
    ref = 10.0 + 1e-3 * rng.standard_normal((8, 100))  # a random network's scores
    close = ref + 1e-4 * rng.standard_normal(ref.shape)
    unrelated = 10.0 + 1e-3 * rng.standard_normal(ref.shape)
    assert mean_centered_cosine([ref], [close]) > 0.99
    assert abs(mean_centered_cosine([ref], [unrelated])) < 0.2
    from trtqat.arrays import row_cosines

    assert row_cosines(ref, unrelated).mean() > 0.999  # plain cosine cannot tell them apart


def test_top1_counts_decisive_rows_and_the_centered_cosine_catches_a_broken_graph():
    """Random-weight scores (near-constant, tiny top-1 margins): rounding-level noise flips
    some top-1s, which the plain top-1 counted as failures; only rows whose reference leads
    by 3 standard deviations of the candidate's noise count, an unrelated graph fails on the
    cosine, and a flip by one class moving alone (no noise elsewhere) counts."""
    rng = np.random.default_rng(0)
    x = (10.0 + 1e-3 * rng.standard_normal((64, 100))).astype(np.float32)
    feeds = [{"x": x}]
    noise = 3e-5 * rng.standard_normal(100)  # centered cosine ~0.9995
    out = x + noise.astype(np.float32)
    assert (out.argmax(1) == x.argmax(1)).mean() < 0.99  # what the plain top-1 saw
    ref_model = _add(np.zeros(100))
    found = check_agreement(ref_model, _add(noise), feeds, threads=1, metric="top1")
    assert found["top1_agreement"] == 1.0 and 0 < found["decisive"] < found["samples"] == 64
    assert found["mean_centered_cosine"] > 0.999
    with pytest.raises(AgreementError, match=r"mean centered cosine 0\.\d+ < 0\.9800 on 64"):
        check_agreement(ref_model, _add(1e-3 * rng.standard_normal(100)), feeds, threads=1)
    lead = x.copy()
    lead[:, 0] += 5e-3  # class 0 leads every row
    moved = np.zeros(100)
    moved[1] = 1e-2  # class 1 alone overtakes it: a localized error, not noise
    with pytest.raises(AgreementError, match="top-1 agreement 0.00% < 99.00% on 64 inputs"):
        check_agreement(ref_model, _add(moved), [{"x": lead}], threads=1, min_cosine=0.0)
