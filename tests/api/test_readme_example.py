"""README.md's Python code runs as written: the "Python API" example (quantize with
forward_loop, a few QAT steps in a plain loop with qat_recipe, export_onnx int8, build_engine,
benchmark) in this process, with checks of what it made, and every other ```python block in a
fresh Python process, in an empty folder (a block whose first line is ``# NAME.py`` is also
that file, as the README presents it, for the blocks after it)."""

from __future__ import annotations

import inspect
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from readme_lib import README, code_blocks, file_name


def python_api_example() -> str:
    """The first ```python block of the README's "Python API" section."""
    section = README.read_text().split("\n## Python API\n", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match, "README.md's Python API section has no ```python block"
    return match[1]


def python_blocks() -> list[tuple[int, str]]:
    """``(line number, code)`` of every ```python block of README.md, in order."""
    return code_blocks(lang="python")


# blocks that export, train or build (the others only build and calibrate small models)
HEAVY = ("export_onnx", "build_engine")


def _block_params() -> list:
    api = python_api_example()
    return [pytest.param(line, code, id=f"README.md:{line}",
                         marks=[pytest.mark.slow] if any(h in code for h in HEAVY) else [])
            for line, code in python_blocks() if code != api]


def test_the_readme_has_python_blocks():
    assert len(python_blocks()) >= 5
    assert python_api_example() in [code for _, code in python_blocks()]


@pytest.mark.parametrize(("line", "code"), _block_params())
def test_every_python_block_runs_as_written(line, code, tmp_path):
    for _, earlier in python_blocks():  # the files the README showed before this block
        if earlier == code:
            break
        if file_name(earlier):
            (tmp_path / file_name(earlier)).write_text(earlier)
    script = tmp_path / (file_name(code) or f"readme_{line}.py")
    script.write_text(code)
    root = str(README.parent)
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"README.md:{line}: {proc.stderr[-3000:]}"


def test_the_python_api_example_runs_as_written(tmp_path, monkeypatch, capsys):
    import trtqat

    assert "forward_loop" in inspect.signature(trtqat.quantize).parameters
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(python_api_example(), str(README), "exec"), scope)  # noqa: S102

    result, engine, timing = scope["result"], scope["engine"], scope["timing"]
    assert result.passed and result.lint is not None and result.lint.ok
    assert result.path == Path("resnet18-int8.onnx") and (tmp_path / result.path).is_file()
    graph = onnx.load(str(tmp_path / result.path)).graph
    assert sum(n.op_type == "QuantizeLinear" for n in graph.node) >= 20  # every conv's input
    assert engine.path.resolve() == tmp_path / "resnet18-int8.engine"
    assert (tmp_path / "resnet18-int8.engine").is_file()
    assert (tmp_path / "resnet18-int8.engine.json").is_file()  # the sidecar
    assert len(timing.queries) >= 10 and timing.config["shapes"] == {"input": [8, 3, 32, 32]}
    assert timing.throughput_qps > 0 and math.isfinite(timing.latency.cov)
    out = capsys.readouterr().out
    assert "PASS  TensorRT Q/DQ lint" in out and " qps, median latency " in out
    assert scope["recipe"].epochs == 1 and scope["recipe"].lr == 0.001
