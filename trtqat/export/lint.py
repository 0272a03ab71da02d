"""TensorRT Q/DQ placement lint: will this ONNX file build into a fully INT8 (or FP8) engine?

Each rule has an id; errors break INT8 execution (or the build), warnings cost speed
(extra reformats, layers left in FP16/FP32). See ``RULES`` (in
:mod:`trtqat.export.lint_report`, with the report classes) for the list. Q/DQ with FP8 E4M3
zero points follow the FP8 rules of :mod:`trtqat.export.lint_fp8`.
"""

from __future__ import annotations

import fnmatch
import os
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx

from trtqat.export import lint_fp8
from trtqat.export._graph import GraphIndex, attr, opset_version
from trtqat.export.errors import LintError
from trtqat.export.lint_report import RULES, Finding, LintReport, format_report
from trtqat.export.lint_scales import DATA_MOVEMENT as _DATA_MOVEMENT
from trtqat.export.lint_scales import all_equal, consumer_scales, distinct, readers, scales_of

__all__ = ["RULES", "SKIP_LAYERS_KEY", "Finding", "LintReport", "format_report", "lint_model",
           "skip_patterns"]

WEIGHTED = {"Conv", "ConvTranspose", "Gemm", "MatMul"}

# Ops TensorRT fuses with Q/DQ or moves Q/DQ across (INT8-capable or data movement).
INT8_CAPABLE = WEIGHTED | {
    "Add", "Sub", "Mul", "Concat", "MaxPool", "AveragePool", "GlobalAveragePool",
    "GlobalMaxPool", "ReduceMean", "ReduceMax", "Relu", "LeakyRelu", "Clip",
    "BatchNormalization", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Slice",
    "Split", "Gather", "Pad", "Identity", "Resize", "Upsample", "DepthToSpace",
    "SpaceToDepth", "Expand", "Tile", "Shape", "QuantizeLinear", "DequantizeLinear",
}

# Why common transformer ops fed by a DQ are wrong (appended to the no-int8-form message).
_FLOAT_OP_HINTS = {
    "Softmax": " (in TensorRT's attention placement the Q/DQ goes after the Softmax, on the "
               "P input of P.V, not before it)",
    "LayerNormalization": " (LayerNorm runs in FP16/FP32; quantize the MatMul inputs after it)",
    "Erf": " (GELU runs in float; quantize the MatMul input after it)",
}

# Ops whose output is a convolution/matmul result (the non-identity branch of a residual).
_CONV_BRANCH = WEIGHTED | {"BatchNormalization"}


def lint_model(model: onnx.ModelProto | str | os.PathLike) -> LintReport:
    """Check the Q/DQ placement of an ONNX model (a ModelProto or a path)."""
    source = "<model>"
    if not isinstance(model, onnx.ModelProto):
        source = str(model)
        if Path(source).is_dir():
            raise LintError(f"{source} is a folder, not an ONNX file: pass the .onnx file "
                            "itself, e.g. trtqat lint export/model-qat-int8.onnx")
        if not Path(source).is_file():
            raise LintError(f"{source} does not exist: pass an .onnx file")
        try:
            model = onnx.load(source)
        except Exception:
            raise LintError(f"{source} is not an ONNX model (truncated or another format): "
                            "pass an .onnx written by `trtqat export`") from None
        if model.ir_version <= 0 or not model.graph.node:  # empty bytes parse as an empty model
            raise LintError(f"{source} is empty or not an ONNX file (no graph): pass an .onnx "
                            "written by `trtqat export`")
    return _Linter(model).run(source)


def _layer_of(name: str) -> str:
    """Module path from a node name such as ``layer1.0.conv1._input_quantizer/Dequantize``."""
    path = name.split("/")[0]
    parts = [p for p in path.split(".") if not p.endswith("quantizer")]
    return ".".join(parts) or path


SKIP_LAYERS_KEY = "trtqat.skip_layers"  # metadata_props: comma-separated glob patterns
_ON_PURPOSE = {"float-layer", "residual-add", "unquantized-input"}
# ops between attention scores and their Softmax (a mask Add, reshapes of the windows)
_TO_NORM = frozenset({"Add", "Reshape", "Transpose", "Unsqueeze", "Squeeze", "Flatten"})


def _scope(name: str) -> str:
    """Module path of a node name or a layer pattern, quantizer parts dropped ('' = root)."""
    path = name.split("/")[0] if "/" in name else name
    return ".".join(p for p in path.split(".") if not p.endswith("quantizer"))


def skip_patterns(model: onnx.ModelProto) -> tuple[str, ...]:
    """The ``--skip-layers`` patterns an export recorded in the file's metadata."""
    for prop in model.metadata_props:
        if prop.key == SKIP_LAYERS_KEY:
            return tuple(p for p in prop.value.split(",") if p)
    return ()


class _Linter:
    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        self.g = GraphIndex(model.graph)
        self.findings: list[Finding] = []
        skip = skip_patterns(model)
        self.skip = tuple(dict.fromkeys([*skip, *(_scope(p) for p in skip)]))

    def _on_purpose(self, rule: str, name: str) -> bool:
        if rule not in _ON_PURPOSE or not self.skip:
            return False
        scope = _scope(name) if "/" in name else ""
        return any(fnmatch.fnmatchcase(scope, p) for p in self.skip)

    def add(self, rule: str, severity: str, node: onnx.NodeProto | str, message: str) -> None:
        name = node if isinstance(node, str) else (node.name or f"<{node.op_type}>")
        if self._on_purpose(rule, name):
            severity, message = "info", "left in float on purpose (--skip-layers)"
        self.findings.append(Finding(rule, severity, name, message))

    def run(self, source: str) -> LintReport:
        nodes = self.model.graph.node
        if not any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in nodes):
            self.add("no-qdq", "error", "<graph>", RULES["no-qdq"] +
                     "; export the int8 variant from a calibrated or QAT checkpoint")
            return LintReport(self.findings, source)
        opset = opset_version(self.model)
        if opset < 13:
            self.add("opset", "error", "<graph>", f"opset {opset}: {RULES['opset']}")
        for node in nodes:
            if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
                self._check_qdq(node)
            if node.op_type in WEIGHTED:
                self._check_weighted(node)
            if node.op_type == "Conv":
                lint_fp8.check_fp8_conv(self, node)
            elif node.op_type == "Add":
                self._check_add(node)
            elif node.op_type == "Concat":
                self._check_concat(node)
            elif node.op_type == "MaxPool":
                self._check_maxpool(node)
        self._check_shared_tensors()
        lint_fp8.check_mixed_formats(self)
        return LintReport(self.findings, source)

    # -------------------------------------------------------------- helpers
    def _scale(self, node: onnx.NodeProto) -> np.ndarray | None:
        return self.g.constant(node.input[1]) if len(node.input) > 1 else None

    def _dq(self, tensor: str) -> onnx.NodeProto | None:
        """The DQ producing ``tensor``, looking through data movement TensorRT commutes."""
        for _ in range(8):
            node = self.g.producer.get(tensor)
            if node is None:
                return None
            if node.op_type == "DequantizeLinear":
                return node
            if node.op_type not in _DATA_MOVEMENT:
                return None
            tensor = node.input[0]
        return None

    def _axis_at_dq(self, tensor: str, axis: int, rank: int) -> int | None:
        """``axis`` of ``tensor`` as an axis of its DQ's output, mapped back through Transposes.

        Linear weights reach a MatMul as ``DQ(int8 W[out, in]) -> Transpose``; None when
        another data-movement op (Reshape, ...) is in between and the axis cannot be mapped.
        """
        for _ in range(8):
            node = self.g.producer.get(tensor)
            if node is None or node.op_type == "DequantizeLinear":
                return axis
            if node.op_type == "Transpose":
                perm = attr(node, "perm", None) or list(range(rank))[::-1]
                axis = int(perm[axis])
            elif node.op_type != "Identity":
                return None
            tensor = node.input[0]
        return None

    def _is_weight_dq(self, dq: onnx.NodeProto) -> bool:
        """A DQ whose data is constant: an int8 initializer or Q(initializer)."""
        src = dq.input[0]
        if self.g.is_constant(src):
            return True
        q = self.g.produced_by(src, "QuantizeLinear")
        return q is not None and self.g.is_constant(q.input[0])

    def _weight_shape(self, dq: onnx.NodeProto) -> tuple[int, ...] | None:
        src = dq.input[0]
        q = self.g.produced_by(src, "QuantizeLinear")
        value = self.g.constant(q.input[0] if q is not None else src)
        return None if value is None else tuple(value.shape)

    # -------------------------------------------------------------- rules
    def _check_qdq(self, node: onnx.NodeProto) -> None:
        kind = "QuantizeLinear" if node.op_type == "QuantizeLinear" else "DequantizeLinear"
        if len(node.input) < 2 or not self.g.is_constant(node.input[1]):
            self.add("scale", "error", node, f"{kind} scale is computed at run time; TensorRT "
                     "needs a constant initializer")
        else:
            scale = self._scale(node)
            if scale is None or not np.all(np.isfinite(scale)) or np.any(scale <= 0):
                self.add("scale", "error", node, f"{kind} scale must be positive and finite")
        if len(node.input) < 3 or not node.input[2]:
            self.add("zero-point", "error", node, f"{kind} has no zero-point (that means "
                     "uint8); TensorRT needs an int8 zero-point of 0")
        elif not self.g.is_constant(node.input[2]):
            self.add("zero-point", "error", node, "zero-point is not a constant")
        else:
            zp = self.g.constant(node.input[2])
            if zp is not None and zp.dtype != np.int8 and not lint_fp8.is_fp8(zp):
                self.add("zero-point", "error", node, f"zero-point is {zp.dtype}, not int8 "
                         "(TensorRT quantizes symmetrically to int8)")
            elif zp is not None and np.any(zp != 0):
                self.add("zero-point", "error", node, "zero-point is not 0 (TensorRT "
                         "quantization is symmetric)")
        if node.op_type == "QuantizeLinear":
            users = self.g.consumers.get(node.output[0], [])
            if node.output[0] in self.g.outputs or any(
                    u.op_type != "DequantizeLinear" for u in users):
                self.add("unpaired-qdq", "error", node, "its int8 output must go only into "
                         "DequantizeLinear")
            return
        weight = self._is_weight_dq(node)
        scale = self._scale(node)
        if not weight and scale is not None and scale.size > 1:
            self.add("activation-per-channel", "error", node, f"activation scale has "
                     f"{scale.size} values; TensorRT quantizes activations per tensor")
        if not weight and not self.g.produced_by(node.input[0], "QuantizeLinear"):
            self.add("unpaired-qdq", "error", node, "input comes neither from a "
                     "QuantizeLinear nor from an int8 initializer")
        if not weight and lint_fp8.zero_point_kind(self, node) == "fp8":
            lint_fp8.check_fp8_users(self, node, _layer_of(node.name))
        elif not weight:
            for user in self._float_users(node.output[0]):
                layer = _layer_of(node.name)
                self.add("no-int8-form", "error", user, f"{user.op_type} takes the "
                         f"quantized output of {node.name or 'a DequantizeLinear'} but has "
                         f"no INT8 form in TensorRT{_FLOAT_OP_HINTS.get(user.op_type, '')}; "
                         f"leave layer '{layer}' in float (--skip-layers {layer})")

    def _float_users(self, tensor: str) -> list[onnx.NodeProto]:
        """Consumers of ``tensor`` with no INT8 form, looking through data movement.

        ``DQ -> Reshape -> LayerNormalization`` feeds the LayerNorm int8 values just as a
        direct edge does: TensorRT moves the DQ across the Reshape.
        """
        found = [user for user, _ in readers(self.g.consumers, tensor)
                 if user.op_type not in INT8_CAPABLE]
        return found

    def _weight_index(self, node: onnx.NodeProto) -> tuple[int, int] | None:
        """(activation input, weight input) indices, or None if no input is a weight."""
        if node.op_type == "MatMul":
            for w_idx in (1, 0):
                dq = self._dq(node.input[w_idx])
                if self.g.is_constant(node.input[w_idx]) or (dq and self._is_weight_dq(dq)):
                    return 1 - w_idx, w_idx
            return None
        return 0, 1

    def _expected_axis(self, node: onnx.NodeProto, rank: int, w_idx: int) -> int:
        if node.op_type == "ConvTranspose":
            return 1
        if node.op_type == "Gemm":
            return 0 if attr(node, "transB", 0) else 1
        if node.op_type == "MatMul":
            return rank - 1 if w_idx == 1 else rank - 2
        return 0

    def _check_weighted(self, node: onnx.NodeProto) -> None:
        idx = self._weight_index(node)
        if idx is None:  # activation x activation MatMul (attention's Q.K^T and P.V)
            missing = [i for i in (0, 1) if not self._dq(node.input[i])]
            if len(missing) == 1:
                src = self.g.producer.get(node.input[missing[0]])
                what = f" (the output of {src.op_type})" if src is not None else ""
                self.add("unquantized-input", "error", node,
                         f"input {missing[0]}{what} has no DequantizeLinear: an activation x "
                         "activation MatMul (attention) runs in INT8 only with Q/DQ on both "
                         "operands")
            elif len(missing) == 2:
                self.add("float-layer", "warning", node, "no Q/DQ on either operand of this "
                         "activation x activation MatMul: runs in float")
            return
        a_idx, w_idx = idx
        act_dq = self._dq(node.input[a_idx])
        w_dq = self._dq(node.input[w_idx])
        if not act_dq and not w_dq:
            self.add("float-layer", "warning", node, "no Q/DQ on its inputs: runs in float")
            return
        if not act_dq:
            self.add("unquantized-input", "error", node, "weight is quantized but the "
                     "activation input has no DequantizeLinear")
        if not w_dq:
            self.add("unquantized-input", "error", node, "activation is quantized but the "
                     "weight has no DequantizeLinear")
            return
        scale = self._scale(w_dq)
        shape = self._weight_shape(w_dq)
        if scale is None or shape is None:
            return
        if scale.size == 1:  # one output channel: per tensor is per channel
            if lint_fp8.zero_point_kind(self, w_dq) == "fp8":
                return  # FP8 weights per tensor are common (ModelOpt's default), not a finding
            if len(shape) > 1 and shape[self._expected_axis(node, len(shape), w_idx)] > 1:
                self.add("per-tensor-weight", "warning", w_dq, f"weight of {node.name} is "
                         "quantized per tensor; per output channel is more accurate")
            return
        rank = len(shape)
        want = self._axis_at_dq(node.input[w_idx], self._expected_axis(node, rank, w_idx), rank)
        if want is None:  # reshaped between DQ and the layer: the axis cannot be mapped
            return
        axis = attr(w_dq, "axis", 1) % max(rank, 1)
        if axis != want or scale.size != shape[want]:
            self.add("weight-axis", "error", w_dq, f"weight of {node.name} ({node.op_type}, "
                     f"shape {list(shape)}) is quantized on axis {axis} with {scale.size} "
                     f"scales; expected axis {want} with {shape[want]}")

    def _check_add(self, node: onnx.NodeProto) -> None:
        inputs = [i for i in node.input if i and not self.g.is_constant(i)]
        if len(inputs) != 2 or any(self._dq(i) for i in inputs):
            return
        if self._reaches_norm(node.output[0]):
            return  # a transformer's residual (the sum goes to a float LayerNorm), or
            # attention scores plus a position bias or mask going to the Softmax (through
            # the reshapes and the second Add of a shifted window's mask, as in Swin)
        producers = [self.g.producer.get(i) for i in inputs]
        # TensorRT fuses the Add into a conv whose output only the Add reads; a conv output
        # read elsewhere too (a stem feeding the next conv and the shortcut) cannot fuse
        if any(p is not None and p.op_type in _CONV_BRANCH
               and len(self.g.consumers.get(i, [])) == 1 for p, i in zip(producers, inputs)):
            self.add("residual-add", "warning", node, "neither input has Q/DQ: quantize the "
                     "identity input so TensorRT fuses conv + add and keeps the block INT8")

    def _reaches_norm(self, name: str, hops: int = 6) -> bool:
        """True when ``name`` flows into a LayerNormalization or Softmax through at most
        ``hops`` reshapes or further Adds (float ops TensorRT keeps around them)."""
        for user in self.g.consumers.get(name, []):
            if user.op_type in ("LayerNormalization", "Softmax"):
                return True
            if hops and user.op_type in _TO_NORM and self._reaches_norm(user.output[0],
                                                                        hops - 1):
                return True
        return False

    def _check_concat(self, node: onnx.NodeProto) -> None:
        inputs = [i for i in node.input if i and not self.g.is_constant(i)]
        carried = [scales_of(self, i) for i in inputs]
        out = consumer_scales(self, node.output[0])
        if not any(carried) and not out:
            return
        if not out and any(carried) and not all(carried):
            self.add("concat-scales", "warning", node, "mixes quantized and float inputs; "
                     "quantize every input with one scale")
            return
        scales = [s for group in carried for s in group] + out
        if not all_equal(scales):
            self.add("concat-scales", "warning", node, f"its inputs and consumers carry "
                     f"{distinct(scales)} different scales; TensorRT inserts reformats unless "
                     "they share one")

    def _check_maxpool(self, node: onnx.NodeProto) -> None:
        scales = scales_of(self, node.input[0]) + consumer_scales(self, node.output[0])
        if not all_equal(scales):
            self.add("maxpool-scales", "warning", node, f"its input and output carry "
                     f"{distinct(scales)} different scales; TensorRT moves Q/DQ across "
                     "MaxPool, so they should share one")

    def _check_shared_tensors(self) -> None:
        by_tensor: dict[str, list[onnx.NodeProto]] = defaultdict(list)
        for node in self.model.graph.node:
            if node.op_type == "QuantizeLinear" and not self.g.is_constant(node.input[0]):
                by_tensor[node.input[0]].append(node)
        for tensor, qs in by_tensor.items():
            scales = [self._scale(q) for q in qs]
            if len(qs) > 1 and any(s is None or not np.array_equal(s, scales[0])
                                   for s in scales):
                names = ", ".join(q.name for q in qs[:4])
                self.add("shared-tensor-scales", "warning", qs[0], f"tensor '{tensor}' is "
                         f"quantized by {len(qs)} QuantizeLinear with different scales "
                         f"({names}); give them one amax")
