"""The torch.export-based ONNX exporter, made quiet and fit for fake-quant graphs.

Route: ``torch.onnx.export(..., dynamo=True)`` under :func:`export_mode.enabled`, where
quantizers emit ``fake_quantize_per_{tensor,channel}_affine`` with tensor scales and int32
zero-points; torchlib turns them into QuantizeLinear/DequantizeLinear, and the exporter's
optimizer folds ``amax / 127`` into constant scale initializers.
"""

from __future__ import annotations

import ast
import contextlib
import io
import logging
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Iterator, Sequence

import onnx
import torch
from torch import nn

from trtqat.errors import TrtqatError
from trtqat.export.errors import ExportError
from trtqat.quant import export_mode

log = logging.getLogger(__name__)

EXPORT_OPSET = 18  # the exporter's own opset; others are reached with onnx's converter
_NOISY_LOGGERS = ("torch.onnx", "torch.export", "torch._export", "torch._dynamo", "torch.fx",
                  "torch._subclasses", "onnxscript", "onnx_ir")
_fake_kernels_done = False


def register_fake_kernels() -> None:
    """Shape-only kernels for the two fake-quant ops torch.export traces into.

    ``fake_quantize_per_*_affine`` decompose into ``*_cachemask`` ops that have no fake
    (meta) kernel, so tracing with a symbolic (dynamic) batch fails. These only say the
    output has the input's shape.
    """
    global _fake_kernels_done
    if _fake_kernels_done:
        return
    ops = {
        "aten::_fake_quantize_per_tensor_affine_cachemask_tensor_qparams": "Meta",
        "aten::fake_quantize_per_channel_affine_cachemask": "Meta",
    }

    def fake(x, *args):
        return torch.empty_like(x), torch.empty_like(x, dtype=torch.bool)

    for name in ops:
        if torch._C._dispatch_has_kernel_for_dispatch_key(name, "Meta"):
            continue
        try:
            torch.library.register_fake(name)(fake)
        except RuntimeError as exc:  # already registered by torch or another library
            log.debug("fake kernel for %s not registered: %s", name, exc)
    _fake_kernels_done = True


@contextlib.contextmanager
def quiet() -> Iterator[list[str]]:
    """Capture exporter chatter (progress prints, warnings, C-level output) into the log."""
    captured: list[str] = []
    levels = {}
    for name in _NOISY_LOGGERS:
        logger = logging.getLogger(name)
        levels[name] = logger.level
        logger.setLevel(logging.ERROR)
    sys.stdout.flush()
    sys.stderr.flush()
    with tempfile.TemporaryFile() as sink:
        saved = (os.dup(1), os.dup(2))
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        py_out = io.StringIO()
        try:
            with warnings.catch_warnings(record=True) as caught, \
                    contextlib.redirect_stdout(py_out), contextlib.redirect_stderr(py_out):
                warnings.simplefilter("always")
                yield captured
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
            for name, level in levels.items():
                logging.getLogger(name).setLevel(level)
            sink.seek(0)
            text = sink.read().decode(errors="replace") + py_out.getvalue()
            captured.extend(str(w.message) for w in caught)
            if text.strip():
                captured.append(text)
            if captured:
                log.debug("exporter output:\n%s", "\n".join(captured))


def _root_user_error(exc: BaseException) -> TrtqatError | None:
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, TrtqatError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def _export_failure(model: nn.Module, exc: Exception) -> ExportError:
    text = str(exc)
    ops = sorted(set(re.findall(r"aten\.[A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)?", text)))
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(exc).__name__)
    if ops and ("quantize" in text or "Unsupported" in text or "decomposition" in text):
        return ExportError(
            f"cannot export {type(model).__name__}: op {', '.join(ops[:3])} has no ONNX "
            "(quantized) form; leave the layer that uses it in float (--skip-layers NAME)")
    return ExportError(f"cannot export {type(model).__name__} to ONNX: {first[:300]} "
                       "(run with --log-level DEBUG for the exporter's log)")


IMAGE_AXES = {"batch": 0, "height": 2, "width": 3}  # of an (N, C, H, W) input


def image_dynamic_shapes(axes: Sequence[str], n_inputs: int = 1) -> tuple[dict, ...]:
    """``dynamic_shapes`` making ``axes`` (of batch, height, width) of each image input
    dynamic; an unknown name is an :class:`ExportError`."""
    unknown = [a for a in axes if a not in IMAGE_AXES]
    if unknown:
        raise ExportError(f"--dynamic {','.join(axes)}: unknown axis {unknown[0]!r}; use "
                          f"{', '.join(IMAGE_AXES)}")
    dims = {a: torch.export.Dim(a, min=1) if a == "batch" else torch.export.Dim(a, min=2)
            for a in axes}
    return tuple({IMAGE_AXES[a]: dims[a] for a in axes} for _ in range(n_inputs))


def torch_to_onnx(model: nn.Module, args: Sequence[torch.Tensor], dynamic_batch: bool,
                  input_names: Sequence[str], output_names: Sequence[str],
                  dynamic_shapes: tuple[dict, ...] | None = None) -> onnx.ModelProto:
    """Export ``model`` (eval, quantizers as they are) at :data:`EXPORT_OPSET`.

    ``dynamic_batch`` makes axis 0 of every input dynamic; ``dynamic_shapes`` (one
    ``{axis: torch.export.Dim}`` per input) replaces that for other dynamic axes.
    """
    register_fake_kernels()
    if dynamic_shapes is None and dynamic_batch:
        batch = torch.export.Dim("batch")
        dynamic_shapes = tuple({0: batch} for _ in args)
    try:
        with quiet(), export_mode.enabled(), torch.no_grad():
            program = torch.onnx.export(
                model, tuple(args), dynamo=True, opset_version=EXPORT_OPSET,
                dynamic_shapes=dynamic_shapes, input_names=list(input_names),
                output_names=list(output_names), optimize=True, verbose=False,
                external_data=False)
    except Exception as exc:
        user = _root_user_error(exc)
        if user is not None:
            raise user from None
        log.debug("torch.onnx.export failed", exc_info=True)
        raise _export_failure(model, exc) from None
    return program.model_proto


def name_nodes(graph: onnx.GraphProto) -> None:
    """Name nodes after their module (``layer1.0.conv1/Conv``), then drop exporter metadata.

    The exporter's per-node metadata holds stack traces with local file paths; the module
    path is all a reader (or the lint) needs.
    """
    used: set[str] = set()
    for node in graph.node:
        scopes: list[str] = []
        for prop in node.metadata_props:
            if prop.key == "pkg.torch.onnx.name_scopes":
                with contextlib.suppress(ValueError, SyntaxError):
                    scopes = list(ast.literal_eval(prop.value))
        # cumulative module paths, then the aten op: ['', 'layer1', 'layer1.0', ..., op]
        path = next((s for s in reversed(scopes[:-1]) if s), "")
        base = f"{path}/{node.op_type}" if path else node.op_type
        name, i = base, 1
        while name in used:
            name, i = f"{base}_{i}", i + 1
        node.name = name
        used.add(name)
        del node.metadata_props[:]
    for value in list(graph.input) + list(graph.output):
        del value.metadata_props[:]
    for init in graph.initializer:
        del init.metadata_props[:]
