"""Which variants a comparison measures, found from a run folder's checkpoints."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from trtqat.families.types import CompareError, Variant
from trtqat.stages.compare import DEMO_RUNS
from trtqat.variants import arch_label, ptq_tag, stage_tag

log = logging.getLogger(__name__)


def default_run() -> str | None:
    """``compare`` without ``--run`` or ``--onnx``: the demo's run folder when it exists."""
    return DEMO_RUNS if Path(DEMO_RUNS).is_dir() else None


def resolve_run(run_dir: str | Path) -> Path:
    """The folder whose checkpoints a comparison reads: ``run_dir`` itself, or its only model
    sub-folder when it holds one model's runs a level down (``trtqat demo`` writes
    ``runs/demo/<model>/{fp32,ptq-*,qat}``). Several models there: one line naming them."""
    root = Path(run_dir)
    if not root.is_dir():
        raise CompareError(f"run folder {root} does not exist: run `trtqat demo` or pass the "
                           "folder that holds your fp32/ptq/qat runs")
    if (root / "best.pt").is_file() or any(p.is_file() for p in root.glob("*/best.pt")):
        return root
    models = sorted({p.parent.parent.name for p in root.glob("*/*/best.pt") if p.is_file()})
    if len(models) == 1:
        log.info("%s holds the runs of one model: comparing %s", root, root / models[0])
        return root / models[0]
    if models:
        raise CompareError(f"{root} holds the runs of {len(models)} models "
                           f"({', '.join(models)}); one report compares one model: pick one, "
                           f"e.g. --run {root / models[0]}")
    return root


def variants_of_checkpoint(path: Path, ckpt: dict[str, Any]) -> list[Variant]:
    """The variants one checkpoint yields (FP32: fp32 + fp16; PTQ: its format's base variant,
    int8 / fp8 / int4; QAT: that and its fp16 form). INT8 rows keep their names
    (``ptq-max``, ``qat-int8``); other formats' carry theirs (``ptq-max-fp8``, ``qat-fp8``)."""
    from trtqat import families
    from trtqat.formats import of_checkpoint

    fmt = of_checkpoint(ckpt)
    suffix = "" if fmt == "int8" else f"-{fmt}"
    stage = ckpt.get("stage", "fp32")
    spec = ckpt.get("model", {})
    at = {"stage": stage, "arch": arch_label(str(spec.get("arch", "model"))),
          "family": families.of_checkpoint(ckpt).name, "tag": stage_tag(ckpt)}
    if stage == "fp32":
        return [Variant("fp32", "fp32", "fp32", path, **at),
                Variant("fp16", "fp16", "fp16", path, **at)]
    if stage == "ptq":
        return [Variant(ptq_tag(ckpt.get("calib") or {}) + suffix, fmt, fmt, path, **at)]
    if stage == "qat":
        return [Variant(f"qat-{fmt}", fmt, fmt, path, **at),
                Variant(f"qat-{fmt}-fp16", f"{fmt}-fp16", f"{fmt}-fp16", path, **at)]
    return []


def discover(run_dir: str | Path) -> tuple[list[Variant], dict[str, Any]]:
    """Variants of every ``best.pt`` in ``run_dir`` and its sub-folders.

    Returns them in report order, and the FP32 checkpoint's data settings
    (data, image_size, arch) that the comparison measures on.
    """
    from trtqat import families
    from trtqat.runs.checkpoint import load_checkpoint

    root = Path(run_dir)
    if not root.is_dir():
        raise CompareError(f"run folder {root} does not exist: run `trtqat demo` or pass the "
                           "folder that holds your fp32/ptq/qat runs")
    paths = sorted(p for p in [root / "best.pt", *root.glob("*/best.pt")] if p.is_file())
    found: dict[str, Variant] = {}
    settings: dict[str, Any] = {}
    first_arch: tuple[Path, str] | None = None
    for path in paths:
        ckpt = load_checkpoint(path)
        spec, args = ckpt.get("model", {}), ckpt.get("args") or {}
        arch = str(spec.get("arch"))
        first_arch = first_arch or (path, arch)
        if arch != first_arch[1]:  # one report compares one model's FP32/PTQ/QAT engines
            raise CompareError(
                f"{path} holds model {arch} but {first_arch[0]} holds {first_arch[1]}; give "
                "--run a folder with one model's runs (or compare ONNX files with --onnx)")
        for v in variants_of_checkpoint(path, ckpt):
            if v.name in found:
                log.warning("%s also gives variant %s; measuring %s only (move the other run "
                            "to its own --run folder to compare it)", path, v.name,
                            found[v.name].checkpoint)
            found.setdefault(v.name, v)
        settings.setdefault("arch", spec.get("arch"))
        if _labelled(args.get("data", "digits")):  # not a calibration-only folder/array
            settings.setdefault("data", args.get("data", "digits"))
        settings.setdefault("image_size", spec.get("image_size") or args.get("image_size"))
        settings.setdefault("family", families.of_checkpoint(ckpt).name)
        if spec.get("preprocess"):
            settings.setdefault("preprocess", spec["preprocess"])
    if not found:
        raise CompareError(f"{root} holds no checkpoints (best.pt): run `trtqat train`, "
                           "`calibrate` and `qat` into its sub-folders first, or pass --onnx files")
    _float_rows_from_ptq(found)
    return sorted(found.values(), key=Variant.sort_key), settings


def _float_rows_from_ptq(found: dict[str, Variant]) -> None:
    """A run that started from a float model (``calibrate --model ...``) has no FP32
    checkpoint: its FP32 and FP16 rows come from the PTQ checkpoint's weights in float, which
    are the float model's (PTQ adds ranges, it does not change weights)."""
    if "fp32" in found:
        return
    ptq = next((v for v in found.values() if v.stage == "ptq"), None)
    if ptq is None:
        return
    for name in ("fp32", "fp16"):
        found.setdefault(name, Variant(name, name, name, ptq.checkpoint, stage="ptq",
                                       arch=ptq.arch, family=ptq.family, tag=""))
    log.info("no FP32 run in the folder: the fp32/fp16 rows are %s in float", ptq.checkpoint)


def _labelled(data: str) -> bool:
    from trtqat.families.cnn.data_sources import data_kind

    return data_kind(str(data)) not in ("flat", "array")


def explicit(paths: list[str]) -> list[Variant]:
    """Variants for ONNX files given by the user (precision read from the graph)."""
    import onnx

    from trtqat import families

    out = []
    for p in paths:
        path = Path(p)
        if not path.is_file():
            raise CompareError(f"{path} does not exist: pass exported ONNX files (trtqat export)")
        try:
            model = onnx.load(str(path), load_external_data=False)
        except Exception:
            raise CompareError(f"{path} is not an ONNX model: pass a file written by trtqat export") from None
        precision = file_precision(model)
        family = families.of_onnx(model).name
        out.append(Variant(path.stem, precision, None, onnx=path, family=family))
    return out


def file_precision(model: Any) -> str:
    """The variant an ONNX file is: its ``trtqat.variant`` metadata, else read from the graph
    (its Q/DQ types, :func:`trtqat.engines.qformats.quant_formats`; float16 initializers:
    the ``-fp16`` form)."""
    import onnx

    from trtqat.engines.qformats import precision_name, quant_formats
    from trtqat.variants import BY_NAME, canonical

    meta = {p.key: p.value for p in model.metadata_props}
    if canonical(meta.get("trtqat.variant", "")) in BY_NAME:
        return canonical(meta["trtqat.variant"])
    fp16 = any(t.data_type == onnx.TensorProto.FLOAT16 for t in model.graph.initializer)
    return precision_name(quant_formats(model), fp16)
