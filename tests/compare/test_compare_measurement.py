"""Compare's measurement rules, with stand-in engines: interleaved timing rounds with their
spread, unstable figures flagged, failed checks measured and marked, emulation marked."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from trtqat.stages.compare.report import VariantResult, build_report, format_markdown, format_table
from trtqat.stages.compare.run import CompareConfig, finish_variant, start_variant
from trtqat.stages.compare.timing import Timed, spread, time_interleaved
from trtqat.stages.compare.variants import Variant


class _Engine:
    """Records the order of benchmark calls; latency per call from ``latencies``."""

    def __init__(self, name: str, calls: list, latencies: list[float]) -> None:
        self.name, self.calls, self.latencies = name, calls, list(latencies)
        self.header = {"providers": ["CPUExecutionProvider"]}
        self.backend = "ort"

    @contextlib.contextmanager
    def runner(self, **_):
        def benchmark(feed, settings):
            self.calls.append((self.name, settings.batch))
            lat = self.latencies.pop(0)
            return SimpleNamespace(stats=lambda _: SimpleNamespace(median=lat),
                                   throughput_qps=settings.batch * 1000.0 / lat)
        yield SimpleNamespace(benchmark=benchmark)


def _timed(name: str, calls: list, latencies: list[float]) -> Timed:
    return Timed(VariantResult(name, "int8"), _Engine(name, calls, latencies), {},
                 {1: {"x": None}})


def test_variants_are_timed_in_interleaved_rotated_rounds():
    calls: list = []
    items = [_timed("a", calls, [1.0, 1.0, 1.0]), _timed("b", calls, [2.0, 2.0, 2.0])]
    time_interleaved(items, [1], duration_s=0.3, warmup_ms=0, rounds=3, echo=lambda _: None)
    assert [c[0] for c in calls] == ["a", "b", "b", "a", "a", "b"]
    a = items[0].result
    assert a.latency_ms[1] == 1.0 and a.latency_spread[1] == 0.0
    assert a.rounds[1]["latency_ms"] == [1.0, 1.0, 1.0]


def test_a_variant_whose_timing_crashes_is_failed_and_the_others_still_timed():
    calls: list = []
    good, bad = _timed("a", calls, [1.0, 1.0, 1.0]), _timed("b", calls, [])
    time_interleaved([good, bad], [1], 0.3, 0, rounds=3, echo=lambda _: None)
    assert good.result.latency_ms[1] == 1.0
    assert bad.result.status == "failed" and "timing: IndexError" in bad.result.error


def test_spread_is_range_over_median():
    assert spread([1.0, 1.1, 1.2]) == pytest.approx(0.2 / 1.1)
    assert spread([5.0]) == 0.0


def _report(results):
    return build_report(results, backend="ort", providers=["cpu"], batch_sizes=[1],
                        metric="top1", dataset={}, settings={})


def test_unstable_failed_check_and_emulated_are_marked():
    calls: list = []
    steady = _timed("fp32", calls, [1.0, 1.0, 1.0])
    noisy = _timed("qat-int8-fp16", calls, [1.0, 3.0, 1.2])
    time_interleaved([steady, noisy], [1], 0.3, 0, rounds=3, echo=lambda _: None)
    noisy.result.precision = "int8+fp16"
    noisy.result.emulated = True
    noisy.result.failed_checks = ["top-1 agreement 'output': 97.70%: 23 of 1000 disagree"]
    report = _report([steady.result, noisy.result])
    json.dumps(report)
    assert report["failed_checks"] == ["qat-int8-fp16"]
    assert any(u.startswith("qat-int8-fp16 latency@1") for u in report["unstable"])
    assert not any(u.startswith("fp32") for u in report["unstable"])
    table = format_table(report)
    assert "(emulated)" in table and "FAILED: top-1 agreement" in table and "±0%" in table
    assert " !" in table  # the unstable figure
    md = format_markdown(report)
    assert md.count("UNSTABLE") == 1 and "spread over 10% (worst: qat-int8-fp16 " in md
    assert "FAILED CHECK (measured anyway)" in md
    assert "(emulated): ONNX Runtime's CPU provider has no FP16 or FP8 kernels" in md
    assert "not TensorRT's FP16" in md and md.count("(emulated):") == 1


def test_unstable_figures_are_one_line_with_the_worst_and_all_in_the_json():
    results = [VariantResult(f"v{i}", "int8", latency_ms={1: 1.0}, throughput={1: 1.0},
                             latency_spread={1: 0.11 + i / 100}, throughput_spread={1: 0.05})
               for i in range(31)]
    report = _report(results)
    assert len(report["unstable"]) == 31  # report.json keeps every one
    md = format_markdown(report)
    lines = [line for line in md.splitlines() if "UNSTABLE" in line]
    assert len(lines) == 1, lines
    assert lines[0].startswith("- UNSTABLE: 31 timing figures spread over 10% (worst: "
                               "v30 latency@1 ±41%, v29 latency@1 ±40%, v28 latency@1 ±39%;")
    assert "(emulated)" not in md


def test_a_variant_that_fails_its_export_check_is_measured_from_an_unchecked_file(tmp_path):
    from trtqat.export import ValidationError
    from trtqat.export.validate import Check

    written: list[tuple[Path, bool]] = []

    def export(path: Path, validate: bool) -> None:
        written.append((path, validate))
        if validate:
            result = SimpleNamespace(checks=[Check("top-1 agreement 'output'", False,
                                                   "97.70%: 23 of 1000 samples disagree")],
                                     lint=None)
            raise ValidationError("m.onnx failed", result)
        path.write_bytes(b"onnx")

    cfg = CompareConfig(run=str(tmp_path), export_dir=str(tmp_path / "export"),
                        out=str(tmp_path / "engines"))
    variant = Variant("ptq-max", "int8", "int8", checkpoint=tmp_path / "best.pt", arch="r18",
                      tag="ptq-max")
    (tmp_path / "export").mkdir()
    result, onnx_path, engine_path = start_variant(variant, cfg, export)
    assert [v for _, v in written] == [True, False]
    assert onnx_path.name == "r18-ptq-max-int8.unchecked.onnx" and onnx_path.is_file()
    assert engine_path.name == "r18-ptq-max-int8.unchecked.ort.engine"
    assert result.failed_checks == ["top-1 agreement 'output': 97.70%: 23 of 1000 samples "
                                    "disagree"]


@pytest.mark.parametrize("precision, emulated", [("int8+fp16", True), ("fp16", True),
                                                 ("int8", False)])
def test_fp16_on_the_ort_cpu_provider_is_marked_emulated(tmp_path, precision, emulated):
    cfg = CompareConfig(run=str(tmp_path))
    result = VariantResult("v", precision)
    engine = _Engine("v", [], [])
    engine.backend = "tensorrt"  # no ONNX payload to count nodes in
    finish_variant(result, engine, cfg)
    assert result.emulated is emulated
    assert any("meant for TensorRT" in n for n in result.notes) is emulated


@pytest.mark.parametrize("formats, emulated", [(("fp8",), True), (("int4",), False)])
def test_fp8_and_int4_on_the_ort_cpu_provider_say_how_they_run(tmp_path, formats, emulated):
    cfg = CompareConfig(run=str(tmp_path))
    result = VariantResult("v", formats[0])
    engine = _Engine("v", [], [])
    engine.backend = "tensorrt"  # no ONNX payload to count nodes in
    engine.header["quant_formats"] = list(formats)
    finish_variant(result, engine, cfg)
    assert result.emulated is emulated
    assert any(formats[0].upper() in n for n in result.notes)
