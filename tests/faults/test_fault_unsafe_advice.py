"""No error text offers the unsafe fix: loading a file of pickled Python objects (weights,
checkpoints, calibration arrays) is refused in trtqat's own words, never with torch's advice
to pass weights_only=False (or numpy's allow_pickle=True), and its payload never runs."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from trtqat.arrays import load_array
from trtqat.errors import TrtqatError
from trtqat.families.cnn.model_source import read_state_dict
from trtqat.runs.checkpoint import load_checkpoint

UNSAFE = ("weights_only", "allow_pickle", "weights only")


class Payload:
    """Pickles as a call that writes a marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _loaders():
    from trtqat.cli.exec_feed import load_calib_inputs
    from trtqat.engines.trtexec_io import _read_array

    return [
        ("pt", read_state_dict, "holds pickled Python objects"),
        ("pt", load_checkpoint, "holds Python objects, which trtqat never unpickles"),
        ("npy", load_array, "holds pickled Python objects"),
        ("npz", load_array, "holds pickled Python objects"),
        ("npz", load_calib_inputs, "holds pickled Python objects"),
        ("npy", lambda p: _read_array("input", Path(p)), "holds pickled Python objects"),
        ("junk.pt", read_state_dict, "not a file of tensors"),
    ]


@pytest.mark.parametrize("case", range(7))
def test_pickled_files_are_refused_without_unsafe_advice(tmp_path, case):
    kind, load, needle = _loaders()[case]
    marker = tmp_path / "ran"
    path = tmp_path / f"evil.{kind}"
    objects = np.array([Payload(marker)], dtype=object)
    if kind == "pt":
        torch.save({"w": torch.zeros(1), "x": Payload(marker)}, path)
    elif kind == "npy":
        np.save(path, objects, allow_pickle=True)
    elif kind == "npz":
        np.savez(path, input=objects)
    else:
        path.write_bytes(b"not a torch file")
    with pytest.raises(TrtqatError) as info:
        load(str(path))
    message = str(info.value)
    assert needle in message and len(message.splitlines()) == 1, message
    assert not any(u in message.lower() for u in UNSAFE), message
    assert not marker.exists()


def test_no_source_advises_the_unsafe_load():
    root = Path(__file__).resolve().parents[2] / "trtqat"
    for path in root.rglob("*.py"):
        text = path.read_text()
        assert "weights_only=False" not in text, path
        assert "allow_pickle=True" not in text, path
