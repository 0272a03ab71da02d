"""An ORT engine build is a function of its inputs: the same Q/DQ ONNX, options and
calibration inputs give the same engine file, byte for byte, and the same verdict, whatever
the process (Python's string hash seed) and --threads."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import onnx

from .qdq_nets import feeds, make
from .test_ort_mobile import efficientnet

BUILD = """
import json, sys
import numpy as np
from trtqat.engines import build_engine
onnx_path, calib, out, threads = sys.argv[1:5]
with np.load(calib) as data:
    feeds = [{"x": data[k]} for k in sorted(data.files)]
engine = build_engine(onnx_path, "ort", threads=int(threads), calib_feeds=feeds,
                      min_top1=0.9)
engine.save(out)
print(json.dumps(engine.header["reencoding"]))
"""


def test_five_builds_give_one_engine(tmp_path):
    """An EfficientNet-like net (SiLU, squeeze-excite, residual Add), fully integer: the
    quantizers the re-encoding adds were named in a per-process order before."""
    _, model = make(efficientnet)
    path = tmp_path / "net.onnx"
    onnx.save(model, path)
    calib = tmp_path / "calib.npz"
    np.savez(calib, **{f"b{k}": f["x"] for k, f in enumerate(feeds(n=2, batch=8))})
    hashes, verdicts = set(), set()
    for k, threads in enumerate((1, 2, 3, 1, 2)):
        out = tmp_path / f"e{k}.engine"
        env = dict(os.environ, PYTHONHASHSEED=str(k + 1))
        done = subprocess.run([sys.executable, "-c", BUILD, str(path), str(calib), str(out),
                               str(threads)], env=env, capture_output=True, text=True,
                              check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        hashes.add(hashlib.sha256(out.read_bytes()).hexdigest())
        verdicts.add(done.stdout.strip().splitlines()[-1])
        side = json.loads((tmp_path / f"e{k}.engine.json").read_text())
        assert side["payload_sha256"] in hashes  # the sidecar carries the build time, not it
    assert len(hashes) == 1 and len(verdicts) == 1
    found = json.loads(verdicts.pop())
    assert found["verdict"]["inputs"] == 2 and found["verdict"]["threads"] == 1
    # the fully integer graph (its added quantizers named and ordered alike every time)
    assert found["kind"] == "integer" and found["verdict"]["integer"] >= 0.9
