"""pyproject's dependencies: a lean core, one ONNX Runtime flavour per extra, optional
packages imported lazily with an install hint, and a dev extra that covers the tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

from trtqat.optional import MissingDependencyError, require

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def names(reqs: list[str]) -> dict[str, Requirement]:
    return {Requirement(r).name.lower(): Requirement(r) for r in reqs}


def test_core_and_extras() -> None:
    core, extras = names(PROJECT["dependencies"]), PROJECT["optional-dependencies"]
    assert "2.5" in core["torch"].specifier and "2.4" not in core["torch"].specifier
    # heavy or flavoured packages stay out of the core
    assert not {"onnxruntime", "onnxruntime-gpu", "scikit-learn", "matplotlib"} & set(core)
    # ort-gpu brings the GPU build alone: nothing in it (or the core) pulls the CPU package
    assert set(names(extras["ort-gpu"])) == {"onnxruntime-gpu"}
    assert set(names(extras["ort"])) == {"onnxruntime"}
    for extra in ("cuda", "tensorrt"):
        assert "12.6.1" in names(extras[extra])["cuda-python"].specifier
        assert "12.6.0" not in names(extras[extra])["cuda-python"].specifier
    assert {"scikit-learn", "matplotlib"} <= set(names(extras["demo"]))
    assert "tensorboard" in names(extras["tensorboard"])
    # `make test` and `make demo` install .[dev]: it must hold what they import
    assert {"onnxruntime", "scikit-learn", "matplotlib", "tensorboard", "pytest",
            "ruff"} <= set(names(extras["dev"]))


def test_core_modules_import_without_the_optional_packages() -> None:
    code = (
        "import sys\n"
        "for m in ('sklearn', 'matplotlib', 'onnxruntime', 'tensorboard'):\n"
        "    sys.modules[m] = None\n"
        "import trtqat.families.cnn.data, trtqat.stages.compare.report, trtqat.stages.sensitivity_report\n"
        "import trtqat.export.validate, trtqat.engines, trtqat.cli\n"
        "from trtqat.optional import MissingDependencyError\n"
        "from trtqat.families.cnn.data import _digits\n"
        "try:\n"
        "    _digits((8, 8), 1, False)\n"
        "except MissingDependencyError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ("the digits data set needs scikit-learn, which is not "
                                  "installed; pip install 'trtqat[demo]'")


def test_require_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    assert require("json", "demo", "x").dumps([]) == "[]"
    for name in ("matplotlib", "matplotlib.pyplot"):  # even when already imported
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(MissingDependencyError, match=r"the chart needs matplotlib, which is not "
                                                     r"installed; pip install 'trtqat\[report\]'"):
        require("matplotlib.pyplot", "report", "the chart")
