"""A model file runs from the bytes that were hashed: a planted ``__pycache__`` .pyc whose
header matches the source never runs, and nothing is written there."""

from __future__ import annotations

import importlib.util
import inspect
import os
import pickle
import py_compile
import sys

import pytest

from trtqat.errors import TrtqatError
from trtqat.families.cnn import model_source as ms

NET = '''from torch import nn

def make(num_classes=10):
    return nn.Linear(4, num_classes)
'''


def plant_pyc(src, marker) -> str:
    """A .pyc of other code (it writes ``marker``) under ``src``'s cache name, with the
    mtime and size of ``src`` in its header: what Python's import would run."""
    evil = f"open({str(marker)!r}, 'w').write('ran')\nfrom torch import nn\nmake = lambda " \
           "num_classes=10: nn.Linear(4, 3)\n"
    size = len(src.read_bytes())
    assert len(evil) < size, "the real source must be longer than the planted one"
    other = src.with_name("other_src.py")
    other.write_text(evil + "#" * (size - len(evil) - 1) + "\n")
    stat = src.stat()
    os.utime(other, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    cache = importlib.util.cache_from_source(str(src))
    py_compile.compile(str(other), cfile=cache, doraise=True,
                       invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP)
    other.unlink()
    return cache


@pytest.fixture
def planted(tmp_path):
    src = tmp_path / "net.py"
    src.write_text(NET + "# padding " * 20 + "\n")
    marker = tmp_path / "ran"
    cache = plant_pyc(src, marker)
    # the plant works: Python's own file import runs it
    spec = importlib.util.spec_from_file_location("planted_check", src)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    assert marker.read_text() == "ran"
    marker.unlink()
    return src, marker, cache


def test_a_planted_pyc_never_runs(planted):
    src, marker, cache = planted
    pyc = open(cache, "rb").read()
    model = ms.build(f"{src}:make", 5)
    assert model.out_features == 5  # the real source's model (the .pyc makes 3 outputs)
    assert not marker.exists()
    assert open(cache, "rb").read() == pyc  # neither read nor rewritten


CLASSES = '''from dataclasses import dataclass
from torch import nn

@dataclass
class Config:
    width: int = 4

class Net(nn.Module):
    def __init__(self, num_classes, cfg=Config()):
        super().__init__()
        self.cfg = cfg
        self.fc = nn.Linear(cfg.width, num_classes)

def make(num_classes=10):
    return Net(num_classes)
'''


def test_a_model_file_writes_no_bytecode_and_its_classes_pickle(tmp_path):
    src = tmp_path / "net.py"
    src.write_text(CLASSES)
    model = ms.build(f"{src}:make", 5)
    assert not (tmp_path / "__pycache__").exists()
    module = sys.modules[ms.module_name(src)]  # registered: dataclasses and pickle find it
    assert module.__file__ == str(src)
    back = pickle.loads(pickle.dumps(model))
    assert back.cfg.width == 4 and back.fc.out_features == 5
    src.write_text("# edited later\n")
    assert "self.cfg = cfg" in inspect.getsource(module.Net)  # the text that ran


def test_rebuilding_runs_only_the_recorded_bytes(tmp_path):
    src = tmp_path / "net.py"
    src.write_text(NET)
    rec = ms.describe(f"{src}:make")
    expected = ms.recorded_sha256(rec["model"], rec)
    assert expected == ms.sha256(src)
    assert ms.build(rec["model"], 5, expected_sha256=expected).out_features == 5
    marker = tmp_path / "ran"
    src.write_text(NET + f"open({str(marker)!r}, 'w').write('ran')\n")
    assert ms.describe(rec["model"]) == rec  # the digest of the bytes that ran
    with pytest.raises(TrtqatError, match="changed since the checkpoint was written"):
        ms.build(rec["model"], 5, expected_sha256=expected)
    assert not marker.exists()


def test_export_of_a_checkpoint_runs_the_source_not_a_planted_pyc(tmp_path, capsys):
    from trtqat.cli import main

    src = tmp_path / "net.py"
    src.write_text(NET.replace("nn.Linear(4, num_classes)", "nn.Sequential(nn.Conv2d(3, 4, 3), "
                               "nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, "
                               "num_classes))") + "# padding " * 20 + "\n")
    run = tmp_path / "ptq"
    assert main(["calibrate", "--model", f"{src}:make", "--data", "synthetic", "--image-size",
                 "16", "--num-batches", "1", "--batch-size", "8", "--limit-batches", "1",
                 "--no-progress", "--method", "max", "--out", str(run)]) == 0
    marker = tmp_path / "ran"
    plant_pyc(src, marker)
    assert main(["export", "-c", str(run / "best.pt"), "--variant", "fp32", "--val-batches",
                 "1", "--out", str(tmp_path / "export")]) == 0, capsys.readouterr().err
    assert not marker.exists()


def test_a_detector_checkpoint_imports_only_its_recorded_file(tmp_path):
    from trtqat.families import get

    src = tmp_path / "my_det.py"
    src.write_text(NET)
    family = get("detect")
    ckpt = {"model": {"family": "detect", "arch": "my_det.make", "num_classes": 3,
                      "source": family.origin(f"detect:{src}:make")}}
    marker = tmp_path / "ran"
    src.write_text(NET + f"open({str(marker)!r}, 'w').write('ran')\n")
    with pytest.raises(TrtqatError, match="changed since the checkpoint was written"):
        family.load(ckpt)
    assert not marker.exists()
