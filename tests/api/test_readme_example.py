"""README.md, "Python API": its example runs as written (quantize with forward_loop, a few
QAT steps in a plain loop with qat_recipe, export_onnx int8, build_engine, benchmark)."""

from __future__ import annotations

import inspect
import math
import re
from pathlib import Path

import onnx

README = Path(__file__).resolve().parents[2] / "README.md"


def python_api_example() -> str:
    """The first ```python block of the README's "Python API" section."""
    section = README.read_text().split("\n## Python API\n", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match, "README.md's Python API section has no ```python block"
    return match[1]


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
