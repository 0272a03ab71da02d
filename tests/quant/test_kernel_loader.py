"""Finding the fast kernels: first-use build cache key, opt-out, warn-once fallback, --version."""

from __future__ import annotations

import os
import sys
import warnings

import pytest
import torch

from trtqat.cli import main
from trtqat.quant import _kernels, kernel_loader


def test_build_key_follows_the_source(monkeypatch, tmp_path):
    src = tmp_path / "fake_quant.cpp"
    src.write_text("int a;")
    monkeypatch.setattr(kernel_loader, "SOURCE", src)
    first = kernel_loader.build_key()
    assert first == kernel_loader.build_key()
    src.write_text("int b;")
    assert kernel_loader.build_key() != first


def test_cache_dir_honours_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("TRTQAT_CACHE_DIR", str(tmp_path / "c"))
    assert kernel_loader.cache_dir() == tmp_path / "c"
    monkeypatch.delenv("TRTQAT_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert kernel_loader.cache_dir() == tmp_path / "trtqat"


def test_first_use_build_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("TRTQAT_JIT", "0")
    module, reason = kernel_loader.cached_cpu()
    assert module is None and "TRTQAT_JIT=0" in reason


def test_failed_first_use_build_says_why(monkeypatch, tmp_path, caplog):
    from torch.utils import cpp_extension

    def no_compiler(**kwargs):
        raise RuntimeError("g++: command not found")

    monkeypatch.setenv("TRTQAT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TRTQAT_JIT", raising=False)
    monkeypatch.setattr(cpp_extension, "load", no_compiler)
    with caplog.at_level("WARNING"):
        module, reason = kernel_loader.cached_cpu()
    assert module is None and "g++: command not found" in reason
    assert "compiling the fused fake-quant CPU kernel once" in caplog.text


def test_missing_kernel_warns_once_with_the_fix_then_falls_back(monkeypatch):
    monkeypatch.setattr(_kernels, "_C", None)
    monkeypatch.setattr(_kernels, "_pending", {"cpu"})
    monkeypatch.setattr(_kernels, "_MISSING", {})
    monkeypatch.setattr(_kernels, "BACKEND", "pytorch")
    monkeypatch.setattr(_kernels, "EXTENSION_ERROR", None)
    monkeypatch.setattr(_kernels, "_forced", "")
    monkeypatch.setattr(kernel_loader, "cpu_kernels",
                        lambda: (None, "not built. Fix: pip install --no-build-isolation ."))
    x, amax = torch.randn(10), torch.tensor(1.0)
    with pytest.warns(RuntimeWarning, match="pure-PyTorch kernels: not built. Fix: pip"):
        y, _ = _kernels.fake_quant_forward(x, amax, -127, 127)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second call is silent
        y2, _ = _kernels.fake_quant_forward(x, amax, -127, 127)
    assert torch.equal(y, y2) and _kernels.BACKEND == "pytorch"
    assert "Fix: pip install" in _kernels.kernel_report()["cpu"]


def test_version_flag_names_versions_and_kernels(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert f"torch {torch.__version__}" in out and "onnxruntime" in out
    assert "fake-quant kernels, CPU: " in out and "fake-quant kernels, CUDA " in out
    if _kernels._C is not None:
        assert "compiled C++" in out


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two CPU cores")
def test_compiled_kernels_run_on_torchs_threads():
    """Built without OpenMP, at::parallel_for runs every kernel loop on one thread whatever
    torch.set_num_threads says (what made QAT slower at 2 threads than at 1)."""
    if _kernels._C is None:
        pytest.skip(f"compiled kernel unavailable: {_kernels.EXTENSION_ERROR}")
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            assert _kernels._C.parallel_threads(64) == threads
    finally:
        torch.set_num_threads(before)
    if sys.platform.startswith("linux"):
        assert "-fopenmp" in kernel_loader._CFLAGS  # the first-use build too
