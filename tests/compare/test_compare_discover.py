"""Which checkpoints ``compare --run`` picks: one model per report, duplicates named."""

from __future__ import annotations

import logging

import pytest

from trtqat.runs.checkpoint import save_checkpoint
from trtqat.stages.compare.variants import CompareError, discover


def _ckpt(path, stage: str, arch: str, **extra) -> None:
    path.mkdir(parents=True)
    save_checkpoint(path / "best.pt", {"stage": stage, "model": {"arch": arch, "num_classes": 10},
                                       "args": {"data": "digits"}, "state_dict": {}, **extra})


def test_runs_of_another_model_are_refused(tmp_path):
    _ckpt(tmp_path / "fp32", "fp32", "resnet18")
    _ckpt(tmp_path / "mqat", "qat", "my_net.make")  # sorts before the fp32 run's "qat"
    with pytest.raises(CompareError, match=r"holds model .* but .* holds .*one model's runs"):
        discover(tmp_path)


def test_a_duplicate_variant_is_named_not_dropped_silently(tmp_path, caplog):
    _ckpt(tmp_path / "fp32", "fp32", "resnet18")
    _ckpt(tmp_path / "qat", "qat", "resnet18")
    _ckpt(tmp_path / "qat-skip", "qat", "resnet18")
    with caplog.at_level(logging.WARNING, logger="trtqat.stages.compare.variants"):
        variants, _ = discover(tmp_path)
    qat = [v for v in variants if v.name == "qat-int8"]
    assert len(qat) == 1 and qat[0].checkpoint == tmp_path / "qat" / "best.pt"
    assert any("qat-skip" in r.getMessage() and "qat-int8" in r.getMessage()
               for r in caplog.records)
