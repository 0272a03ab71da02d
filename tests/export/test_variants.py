"""The variants table drives the CLI choices, file names, tolerances and the family checks."""

from __future__ import annotations

import numpy as np
import pytest

from trtqat import families, variants
from trtqat.arrays import row_cosines
from trtqat.export import criterion, validate
from trtqat.export.checks import MIN_COSINE, CheckContext
from trtqat.variants import artifact_name, canonical, expand_variants, ptq_tag, stage_tag


def _export_parser():
    import argparse

    from trtqat.cli import cmd_export

    sub = argparse.ArgumentParser().add_subparsers()
    cmd_export.register(sub)
    return sub.choices["export"]


def test_cli_choices_and_tolerances_come_from_the_table():
    action = next(a for a in _export_parser()._actions if a.dest == "variant")
    assert tuple(action.choices) == (*(v.name for v in variants.TABLE), "all")
    assert expand_variants("all") == tuple(v.name for v in variants.TABLE
                                           if v.format in (None, "int8"))
    for row in variants.TABLE:
        assert (row.name in validate.REL_TOL) == (row.rel_tol is not None)
        assert criterion.MEAN_LIMIT.get(row.name) == row.mean_limit
        assert MIN_COSINE[row.name] == row.min_cosine
        assert row.name in variants.INT8_VARIANTS if row.int8 else True
    assert variants.variant("int8-fp16").min_opset == 19


def test_one_naming_rule():
    assert stage_tag({"stage": "fp32"}) == ""
    assert stage_tag({"stage": "qat"}) == "qat"
    assert stage_tag({"stage": "ptq", "calib": {"method": "entropy"}}) == "ptq-entropy"
    assert ptq_tag({"method": "percentile", "percentile": 99.9}) == "ptq-percentile-99.9"
    assert artifact_name("resnet18", "ptq-entropy", "int8") == "resnet18-ptq-entropy-int8.onnx"
    assert artifact_name("resnet18", "", "fp16") == "resnet18-fp16.onnx"
    assert artifact_name("/models/tiny-bert", "qat", "int8-fp16") == \
        "tiny_bert-qat-int8-fp16.onnx"
    assert artifact_name("r18", "qat", "int8+fp16", batch=4) == "r18-qat-int8-fp16-b4.onnx"
    with pytest.raises(ValueError, match="unknown variant"):
        artifact_name("r18", "qat", "int3")


def test_the_mixed_variant_has_one_name():
    from trtqat.stages.compare.variants import Variant

    assert canonical("int8+fp16") == "int8-fp16" and expand_variants("int8+fp16") == ("int8-fp16",)
    assert Variant("qat-int8-fp16", "int8+fp16", "int8-fp16").precision == "int8-fp16"


def test_one_cosine():
    a = np.array([[1.0, 0.0], [0.0, 2.0], [0.0, 0.0]])
    b = np.array([[2.0, 0.0], [0.0, -1.0], [1.0, 1.0]])
    np.testing.assert_allclose(row_cosines(a, b), [1.0, -1.0, 0.0])
    with pytest.raises(ValueError, match="one shape"):
        row_cosines(a, b[:2])


def test_families_check_their_own_way():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(64, 10)).astype(np.float32)
    cnn = families.get("cnn").export_check(
        "fp32", [[logits]], [[logits + 1e-7]], CheckContext(names=["output"], counted=[True]))
    assert [c.name for c in cnn] == ["output 'output' vs PyTorch", "top-1 agreement 'output'"]
    assert all(c.passed for c in cnn)
    emb = logits / np.linalg.norm(logits, axis=1, keepdims=True)
    ctx = CheckContext(names=["sentence_embedding"], batches=[(np.zeros((64, 7)),)])
    (line,) = families.get("encoder").export_check("int8", [[emb]], [[-emb]], ctx)
    assert not line.passed and "cosine mean -1.0" in line.detail and "64x7" in line.detail
    assert families.get("cnn").metric(logits, logits.argmax(1)) == {"top1": 100.0,
                                                                   "top5": 100.0}
