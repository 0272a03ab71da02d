"""``compare``: build what is missing, then measure every variant on the same data."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trtqat.engines.registry import DEFAULT_BACKEND, backend_info
from trtqat.errors import TrtqatError
from trtqat.finite import check_finite_arrays
from trtqat.outputs import select
from trtqat.progress import progress as progress_of
from trtqat.stages.compare import figures
from trtqat.stages.compare.data import EvalData, feed_for
from trtqat.stages.compare.report import (
    VariantResult,
    build_report,
    emulation_line,
    format_table,
    refuse_foreign_reports,
    unstable_line,
    write_report,
)
from trtqat.stages.compare.result import CompareReport
from trtqat.stages.compare.timing import ROUNDS, Timed, time_interleaved
from trtqat.stages.compare.variants import (
    DEMO_RUNS,
    CompareError,
    Variant,
    default_run,
    discover,
    explicit,
    resolve_run,
)
from trtqat.variants import artifact_name

log = logging.getLogger(__name__)


@dataclass
class CompareConfig:
    """Options of ``trtqat compare``."""

    run: str | None = None
    onnx: tuple[str, ...] = ()
    backend: str = DEFAULT_BACKEND
    batch_sizes: tuple[int, ...] = (1, 32)
    export_dir: str = "export"
    out: str | None = None  # None: engines/<run folder name>, or engines/ for --onnx only
    data: str | None = None
    image_size: int | tuple[int, int] | None = None
    duration_s: float = 3.0
    warmup_ms: float = 200.0
    threads: int | None = None
    calib_batches: int = 4
    fresh: bool = False
    progress: bool = True
    variants: tuple[str, ...] = ()
    max_length: int = 128  # encoders: tokens per sentence (timing pads to exactly this)
    num_sentences: int = 500  # encoders: held-out sentences scored
    model: str | None = None  # encoders: reference/tokenizer for --onnx files without a run
    metric_output: str | None = None  # several outputs: the one scored (default: the first)

    def __post_init__(self) -> None:
        if not self.run and not self.onnx:
            self.run = default_run()
        if not self.run and not self.onnx:
            raise CompareError(f"give a run folder (--run) or ONNX files (--onnx); there is no "
                               f"{DEMO_RUNS} here to default to (`trtqat demo` writes it)")
        self.batch_sizes = tuple(sorted(set(int(b) for b in self.batch_sizes)))
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            raise CompareError(f"--batch-sizes must be positive integers, got {self.batch_sizes}")
        if self.duration_s <= 0 or self.warmup_ms < 0:
            raise CompareError("--duration must be > 0 s and --warmup >= 0 ms")
        if self.calib_batches < 1:
            raise CompareError("--calib-batches must be >= 1")
        if self.max_length < 2 or self.num_sentences < 3:
            raise CompareError("--max-length must be >= 2 and --num-sentences >= 3")


def _build(variant: Variant, onnx_path: Path, engine_path: Path, cfg: CompareConfig,
           data: EvalData, names: list[str], result: VariantResult):
    """The engine of ``onnx_path`` (cached in ``engine_path``). An ORT int8 re-encoding that
    moves the outputs too far is measured anyway, marked with the failed check (and not
    cached); one that fails otherwise leaves the Q/DQ graph as exported, with a note."""
    from trtqat.engines import build_engine, load_engine
    from trtqat.engines.ort_qdq import AgreementError
    from trtqat.engines.out_check import check_engine_output

    check_engine_output(engine_path, "the engine", [("--onnx", onnx_path)], choose="--out")
    if engine_path.is_file() and not cfg.fresh and engine_path.stat().st_mtime >= onnx_path.stat().st_mtime:
        return _noted(load_engine(engine_path), result)
    big = max(cfg.batch_sizes)
    low, opt = data.dims
    kwargs: dict[str, Any] = {
        "min_shapes": {n: (1, *low) for n in names},
        "opt_shapes": {n: (big, *opt) for n in names},
        "max_shapes": {n: (big, *opt) for n in names},
        "threads": cfg.threads,
    }
    if backend_info(cfg.backend).int8_rewrite and variant.precision.startswith("int8"):
        kwargs["ort_prepare"] = "qdq"
        kwargs["calib_feeds"] = [feed_for(f, names, onnx_path) for f in data.calib]
    try:
        engine = build_engine(onnx_path, cfg.backend, **kwargs)
    except AgreementError as exc:  # measured anyway, marked with the failed check
        result.failed_checks.append(f"CPU re-encoding agreement: {str(exc).splitlines()[0]}")
        return build_engine(onnx_path, cfg.backend, **kwargs, min_top1=0.0, min_cosine=-1.0)
    except TrtqatError as exc:
        if kwargs.get("ort_prepare") != "qdq":
            raise
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        log.warning("%s: the integer re-encoding failed (%s); built as exported",
                    variant.name, first)
        result.notes.append(f"ORT int8 re-encoding failed, Q/DQ run as exported: {first[:160]}")
        kwargs.update(ort_prepare="none", calib_feeds=None)
        engine = build_engine(onnx_path, cfg.backend, **kwargs)
    engine.save(engine_path)
    return _noted(engine, result)


def _noted(engine: Any, result: VariantResult) -> Any:
    """``engine``, after noting in ``result`` that it is the faithful ORT re-encoding, and
    what the re-encoding's verdict depended on."""
    reencoding = engine.header.get("reencoding") or {}
    why = reencoding.get("why")
    if why:
        result.notes.append("ORT faithful re-encoding (residual Adds in float): the fully "
                            f"integer one failed its check: {why[:160]}")
    verdict = verdict_note(reencoding)
    if verdict:
        result.notes.append(verdict)
    return engine


def verdict_note(reencoding: dict[str, Any]) -> str | None:
    """One line: the graph the ORT re-encoding kept, the figures it measured for each graph
    it tried, the threshold and the check inputs (None when nothing was checked)."""
    v = reencoding.get("verdict") or {}
    if not v.get("inputs"):
        return None
    cosine = v.get("metric") == "cosine"

    def fmt(x: float | None) -> str:
        return "-" if x is None else (f"{x:.4f}" if cosine else f"{x:.2%}")

    what = "mean cosine" if cosine else f"{v.get('metric') or 'top1'} agreement"
    return (f"ORT re-encoding verdict: {reencoding.get('kind')} graph; {what} of the integer "
            f"graph {fmt(v.get('integer'))}, faithful {fmt(v.get('faithful'))}, threshold "
            f"{fmt(v.get('threshold'))}, on {v.get('samples')} samples of {v['inputs']} "
            f"{'synthetic' if v.get('source') == 'synthetic' else 'calibration'} batches "
            f"(ORT on {v.get('threads')} thread)")


def score(runner, data: EvalData, names: list[str], family, source: Path,
          progress: bool = True, keep: dict[str, Any] | None = None) -> dict[str, float | None]:
    """``family.metric`` of the engine's outputs on every scored batch (NaN as None;
    ``progress``: lines off a terminal when it takes longer than 30 s); ``keep["predictions"]``
    gets the top-1 of classifier outputs (:func:`figures.predictions`)."""
    outs = []
    for batch in progress_of(data.batches, total=len(data.batches), desc=f"score {Path(source).name}",
                             enabled=progress, brief=True):
        result = runner.infer(feed_for(batch, names, source))
        out = None
        if data.output:
            out = result.get(data.output)
            if out is None:
                out = select(dict(result), data.output)
        outs.append((out if out is not None else next(iter(result.values())))
                    .astype(np.float32))
        check_finite_arrays([("outputs", outs[-1])], "the engine's output", "not measured; "
                            "export and build it from a finite checkpoint")
    got = np.concatenate(outs)
    if len(got) != len(data.targets) or (got.ndim == data.targets.ndim
                                         and got.shape != data.targets.shape):
        raise CompareError(f"the engine returns {got.shape} outputs for {data.targets.shape} "
                           "expected: is it an export of this model?")
    if keep is not None:
        keep["predictions"] = figures.predictions(got)
    return {k: (None if isinstance(v, float) and not np.isfinite(v) else float(v))
            for k, v in family.metric(got, data.targets, **data.metric_args).items()}


def node_counts(engine) -> dict[str, int]:
    """Integer and float compute nodes of an ORT engine ({} for other backends)."""
    if not backend_info(engine.backend).onnx_payload:
        return {}
    import onnx

    from trtqat.engines.ort_qdq import count_compute_nodes

    counts = count_compute_nodes(onnx.load_model_from_string(engine.payload))
    return {"integer": int(counts["integer_total"]), "float": int(counts["float_total"])}


def start_variant(variant: Variant, cfg: CompareConfig, export: Callable[[Path, bool], None]
                  ) -> tuple[VariantResult, Path, Path]:
    """``(result to fill, ONNX path, engine path)``; ``export(onnx_path, validate)`` runs if
    the variant comes from a checkpoint and its ONNX is missing (or ``--fresh``).

    An export that fails its checks is written unchecked beside it (``*.unchecked.onnx``)
    and measured, with the failed checks in ``result.failed_checks``.
    """
    from trtqat.export import ValidationError

    result = VariantResult(variant.name, variant.precision,
                           source=str(variant.checkpoint or variant.onnx))
    onnx_path = variant.onnx or Path(cfg.export_dir) / artifact_name(
        variant.arch, variant.tag, variant.export_variant)
    if variant.onnx is None and (cfg.fresh or not onnx_path.is_file()):
        try:
            export(onnx_path, True)
        except ValidationError as exc:
            checks = getattr(exc.result, "checks", None) or []
            result.failed_checks += [f"{c.name}: {c.detail}" for c in checks if not c.passed]
            lint = getattr(exc.result, "lint", None)
            if lint is not None and not lint.ok:
                result.failed_checks.append(f"lint: {lint.errors[0].line()}")
            if not result.failed_checks:
                result.failed_checks.append(str(exc).splitlines()[0])
            onnx_path = onnx_path.with_name(f"{onnx_path.stem}.unchecked.onnx")
            export(onnx_path, False)
            result.notes.append(f"measured from {onnx_path.name}, an export that failed its "
                                "checks (not usable as a release artifact)")
    engine_path = Path(cfg.out) / f"{onnx_path.stem}.{cfg.backend}.engine"
    result.onnx, result.engine = str(onnx_path), str(engine_path)
    return result, onnx_path, engine_path


def finish_variant(result: VariantResult, engine, cfg: CompareConfig) -> dict[str, Any]:
    """Node counts, providers and the emulation mark of a built engine; returns the runner
    options (threads for ORT)."""
    result.nodes = node_counts(engine)
    result.providers = list(engine.header.get("providers") or [cfg.backend])
    cpu_only = all("cpu" in str(p).lower() for p in result.providers)
    info = backend_info(cfg.backend)
    from trtqat.engines.qformats import cpu_format_notes

    for note in cpu_format_notes(engine.header):  # FP8 emulated in float, INT4's kernel
        result.notes.append(note)
        result.emulated = result.emulated or "fp8" in result.precision
    if info.fp16_emulated_on_cpu and cpu_only and "fp16" in result.precision:
        result.emulated = True
        result.notes.append("emulated: ORT's CPU provider runs fp16 in float (casts around "
                            "float kernels, and its graph optimizations reorder fp16 rounding), so "
                            "its speed and top-1 say nothing about TensorRT's fp16; the "
                            "export check runs the file as written; the variant is meant "
                            "for TensorRT")
    return info.runner_kwargs(threads=cfg.threads)


def measure_variant(variant: Variant, cfg: CompareConfig, data: EvalData, family) -> Timed:
    """Export (if needed), build (if needed), then measure the accuracy (or fidelity) of one
    variant; its speed is measured later, interleaved with the others
    (:func:`time_interleaved`)."""
    from trtqat.engines.onnx_io import load_onnx, onnx_input_specs

    result, onnx_path, engine_path = start_variant(
        variant, cfg, lambda p, check: data.export(variant, p, check))
    names = [s.name for s in onnx_input_specs(load_onnx(onnx_path))]
    for feed in data.batches[:1]:
        feed_for(feed, names, onnx_path)  # a file of another model: say so before building
    engine = _build(variant, onnx_path, engine_path, cfg, data, names, result)
    runner_kwargs = finish_variant(result, engine, cfg)
    result.onnx_mib = figures.onnx_mib(onnx_path)
    kept: dict[str, Any] = {}
    with engine.runner(**runner_kwargs) as runner:
        result.metrics = score(runner, data, names, family, onnx_path, cfg.progress, kept)
    if data.metric == "top1":  # classifiers: agreement with FP32's top-1 (not embeddings)
        result.predictions = kept.get("predictions")
    return Timed(result, engine, runner_kwargs,
                 {b: feed_for(data.timing(b), names, onnx_path) for b in cfg.batch_sizes})


def _family(variants: list[Variant], cfg: CompareConfig):
    """The one family of ``variants`` (CompareError when they mix families)."""
    from trtqat import families

    names = {v.family for v in variants}
    if len(names) > 1:
        raise CompareError(f"cannot compare {' and '.join(sorted(names))} models in one report: "
                           "pick the variants of one model (--variants, or separate "
                           "--run/--onnx)")
    if names:
        return families.get(names.pop())
    return families.of_model(cfg.model) if cfg.model else families.get("cnn")


def compare(cfg: CompareConfig, echo: Callable[[str], None] = print) -> CompareReport:
    """Measure every variant; write report.json/md/png into ``cfg.out``; return the
    :class:`CompareReport`.

    A variant that fails is reported with its error and the others still run; when every
    variant fails no report is written and :class:`CompareError` is raised.
    """
    from trtqat.engines.registry import canonical_backend

    backend = canonical_backend(cfg.backend)
    _require_backend(backend)
    if cfg.run:
        cfg.run = str(resolve_run(cfg.run))
    if cfg.out is None:
        cfg.out = default_out(cfg.run)
    refuse_foreign_reports(cfg.out)
    cfg.backend = backend
    if cfg.run:
        variants, settings = discover(cfg.run)
    else:
        variants, settings = [], {}
    variants += explicit(list(cfg.onnx))
    if cfg.variants:
        unknown = set(cfg.variants) - {v.name for v in variants}
        if unknown:
            raise CompareError(f"no variant named {', '.join(sorted(unknown))}; available: "
                               f"{', '.join(v.name for v in variants)}")
        variants = [v for v in variants if v.name in cfg.variants]
    family = _family(variants, cfg)
    data = family.compare_data(variants, settings, cfg)
    if cfg.metric_output:  # several outputs: the one scored (a name or an index)
        data.output = cfg.metric_output
    Path(cfg.out).mkdir(parents=True, exist_ok=True)
    Path(cfg.export_dir).mkdir(parents=True, exist_ok=True)
    results, timed = [], []
    for i, v in enumerate(variants, 1):
        echo(f"[{i}/{len(variants)}] {v.name} ({v.precision}): export, build, measure ...")
        t0 = time.perf_counter()
        try:
            t = measure_variant(v, cfg, data, family)
            timed.append(t)
            r = t.result
        except TrtqatError as exc:
            r = VariantResult(v.name, v.precision, source=str(v.checkpoint or v.onnx),
                              status="failed", error=str(exc).splitlines()[0])
        except Exception as exc:  # a backend crash must not lose the other variants
            log.debug("variant %s failed", v.name, exc_info=True)
            r = VariantResult(v.name, v.precision, source=str(v.checkpoint or v.onnx),
                              status="failed", error=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        results.append(r)
        status = "ok" if r.status == "ok" else f"FAILED: {r.error}"
        if r.status == "ok" and r.failed_checks:
            status = f"CHECK FAILED (measured anyway): {r.failed_checks[0][:120]}"
        echo(f"      {status} ({time.perf_counter() - t0:.1f}s)")
    time_interleaved(timed, cfg.batch_sizes, cfg.duration_s, cfg.warmup_ms, echo=echo)
    figures.add_agreement(results)
    if all(r.status != "ok" for r in results):
        raise CompareError("every variant failed: " + "; ".join(f"{r.name}: {r.error}" for r in results))
    providers = sorted({p for r in results for p in getattr(r, "providers", [])}) or [backend]
    report = build_report(results, backend=backend, providers=providers,
                          batch_sizes=list(cfg.batch_sizes), metric=data.metric, dataset=data.info,
                          settings={"duration_s": cfg.duration_s, "warmup_ms": cfg.warmup_ms,
                                    "threads": cfg.threads, "run": cfg.run,
                                    "model": settings.get("arch"),
                                    "measurement": "trtexec model: median latency, "
                                    "throughput = batch x queries / walltime; variants "
                                    f"interleaved in {ROUNDS} rotated rounds of duration / "
                                    f"{ROUNDS}, figures are medians over rounds"})
    paths = write_report(report, cfg.out)
    echo("")
    echo(format_table(report))
    echo("")
    echo(f"report: {paths['md']}  {paths['json']}  {paths['png']}")
    if report["partial"]:
        echo(f"PARTIAL: {', '.join(report['failed'])} failed (see report.md)")
    if report["failed_checks"]:
        echo(f"CHECKS FAILED: {', '.join(report['failed_checks'])} (measured anyway, marked "
             "in report.md)")
    for line in (unstable_line(report), emulation_line(report)):
        if line:
            echo(line)
    return CompareReport(report, results, dict(paths))


def default_out(run: str | None) -> str:
    """``--out`` when not given: ``engines/<run folder name>`` (where ``trtqat demo`` puts
    that model's engines and report, so they are reused), ``engines`` for ONNX files only."""
    return str(Path("engines") / Path(run).resolve().name) if run else "engines"


def _require_backend(backend: str) -> None:
    """Import the backend's package now: a missing one is one line before any work."""
    import importlib

    info = backend_info(backend)
    if not info.package:
        return
    try:
        importlib.import_module(info.package)
    except ImportError:
        raise CompareError(f"backend '{info.name}' is not installed: {info.install}") from None
