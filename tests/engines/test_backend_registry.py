"""The backend registry: per-backend facts, help text and flag notes come from one entry,
and no engine command line branches on a backend's name."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from trtqat.cli.exec_cmd import build_parser
from trtqat.cli.exec_notes import ignored_flag_notes
from trtqat.engines import OptionsError, registry
from trtqat.engines.fileformat import KIND_ONNX, KIND_PLAN
from trtqat.engines.registry import BackendInfo, backend_info, register_backend

ROOT = Path(registry.__file__).resolve().parents[1]


@pytest.fixture
def isolated_registry(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(registry, "_BACKENDS", dict(registry._BACKENDS))
    monkeypatch.setattr(registry, "_ALIASES", dict(registry._ALIASES))


def test_facts_of_the_built_in_backends() -> None:
    ort, trt = backend_info("onnxruntime"), backend_info("TRT")
    assert (ort.name, trt.name) == ("ort", "tensorrt")
    assert ort.onnx_payload and ort.file_kind == KIND_ONNX and not trt.onnx_payload
    assert ort.int8_rewrite and not trt.int8_rewrite
    assert ort.takes_threads and not trt.takes_threads
    assert trt.needs_gpu and not ort.needs_gpu and ort.fp16_emulated_on_cpu
    assert ort.runner_kwargs(device=1, threads=2, streams=3) == {"device": 1, "threads": 2}
    assert trt.runner_kwargs(device=1, threads=2, spin_wait=True, streams=3) == {
        "device": 1, "spin_wait": True, "streams": 3}
    with pytest.raises(OptionsError, match="unknown backend 'tvm'; use one of ort, tensorrt"):
        backend_info("tvm")


def test_file_kinds_map_to_backends() -> None:
    assert registry.backend_for_file_kind(KIND_ONNX) == "ort"
    assert registry.backend_for_file_kind(KIND_PLAN) == "tensorrt"
    assert registry.file_kind_of("ort") == KIND_ONNX
    assert registry.file_kind_of(None) == KIND_PLAN


def test_backend_help_comes_from_the_registry() -> None:
    text = build_parser().format_help()
    flat = " ".join(text.split())
    assert "ort (ONNX Runtime, the default for --onnx) or tensorrt (TensorRT)" in flat


def _args(**given) -> argparse.Namespace:
    args = build_parser().parse_args(["--onnx", "m.onnx"])
    for key, value in given.items():
        setattr(args, key, value)
    return args


def test_flag_notes_per_backend() -> None:
    notes = ignored_flag_notes(_args(threads=4, providers="cpu"), "tensorrt", loading=False)
    assert notes == ["--threads is an ONNX Runtime option; the TensorRT backend ignores it",
                     "--providers is an ONNX Runtime option; the TensorRT backend ignores it"]
    ort = ignored_flag_notes(_args(timingCacheFile="c", infStreams=2, device=0), "ort", False)
    assert [n.split()[0] for n in ort] == ["--timingCacheFile", "--infStreams", "--device"]
    on_trt_ep = ignored_flag_notes(_args(timingCacheFile="c", providers="tensorrt"), "ort", False)
    assert on_trt_ep == []


def test_a_new_backend_is_one_registration(isolated_registry) -> None:
    register_backend(BackendInfo(
        name="fake", title="Fake RT", module="trtqat.engines.ort", builder="OrtBuilder",
        engine="OrtEngine", aliases=("frt",), runner_options=("device", "threads"),
        own_flags=("threads",)))
    assert registry.backend_names()[-1] == "fake"
    assert registry.canonical_backend("FRT") == "fake"
    assert registry.builder_class("fake").__name__ == "OrtBuilder"
    assert registry.backends_help().endswith("or fake (Fake RT)")
    assert backend_info("fake").takes_threads and not backend_info("fake").onnx_payload
    notes = dict((d, t) for d, _, t in backend_info("fake").ignored_flags({}))
    assert notes["calibInputs"] == "is an ONNX Runtime option; the Fake RT backend ignores it"
    assert "threads" not in notes  # it honours --threads itself
    assert notes["useSpinWait"] == "is a TensorRT option; the Fake RT backend ignores it"


def test_require_names_the_install_line(isolated_registry) -> None:
    info = register_backend(BackendInfo(
        name="absent", title="Absent", module="x", builder="B", engine="E",
        package="trtqat_no_such_package", install="pip install absent"))
    assert not info.available()
    with pytest.raises(ImportError, match="backend 'absent' is not installed: pip install absent"):
        info.require()
    backend_info("ort").require()  # installed here


@pytest.mark.parametrize("name", ["exec_cmd.py", "exec_feed.py", "exec_notes.py",
                                  "cmd_build.py"])
def test_engine_commands_do_not_branch_on_backend_names(name: str) -> None:
    source = (ROOT / "cli" / name).read_text()
    assert not re.search(r"""[!=]=\s*["'](ort|tensorrt|trt|onnxruntime)["']""", source)
    assert not re.search(r"""["'](ort|tensorrt)["']\s*(==|!=|in\b)""", source)
