"""What the ORT builder checks a CPU re-encoded graph with: the metric of the file's family
(:func:`check_metric`) and, without calibration inputs, seeded synthetic inputs in the range
the file's input quantizers cover (:func:`synthetic_check_feeds`).

Metric, first rule that applies:

1. the file's ``trtqat.task`` metadata: ``classification`` -> ``top1``, ``detection`` ->
   ``detection``, an embedding task -> ``cosine`` (a Hugging Face encoder's classification
   head is ``classification``, its hidden states ``feature-extraction``);
2. its ``trtqat.family`` metadata: ``cnn`` and ``vit`` -> ``top1``, ``encoder`` ->
   ``cosine``, ``detect`` -> ``detection``;
3. no metadata: embeddings (an output named ``*embedding*`` or unit-norm rows) -> ``cosine``;
   a first output of rank 2 with more than one column (``[batch, classes]``) -> ``top1``;
   anything else (feature maps, hidden states) -> ``cosine``, where a top-1 over the last axis
   would mean nothing.

Synthetic inputs (seeded, the same on every build): float inputs read by a QuantizeLinear
are normal around the middle of its range ``[(qmin - zp) * scale, (qmax - zp) * scale]``
with a sixth of its width as standard deviation, clipped to it (int8 symmetric: sigma = amax
/ 3, the whole grid in use); other float inputs standard normal; token ids uniform below the
row count of the embedding table they index (the Gather's table), masks ones, segment ids
zeros. Shapes: ``shapes``/``opt_shapes`` of the build options, else the declared ones with
a dynamic first axis 8 and other dynamic axes 16; as many feeds as make 16 samples.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from trtqat.engines.id_inputs import SAFE_TOKEN_RANGE, valid_integer_feed
from trtqat.engines.onnx_io import index_input_bounds, onnx_input_specs
from trtqat.engines.ort_qdq_graph import Graph

FAMILY_METRICS = {"cnn": "top1", "vit": "top1", "encoder": "cosine", "detect": "detection"}
TASK_METRICS = {"classification": "top1", "detection": "detection", "embedding": "cosine",
                "sentence-embedding": "cosine", "feature-extraction": "cosine"}
SAMPLES = 16          # synthetic check: samples (first-axis rows) in all
DYNAMIC_BATCH = 8     # a dynamic first axis
DYNAMIC_DIM = 16      # any other dynamic axis (sequence length, image side)
SEED = 0


def check_metric(model: onnx.ModelProto, outputs: Sequence[np.ndarray] = (),
                 embedding: bool = False) -> str:
    """``"top1"``, ``"cosine"`` or ``"detection"`` for ``model`` (see the module's rules);
    ``outputs``: reference values of its first output, ``embedding``: they look like
    embeddings (:func:`trtqat.engines.ort_inspect.is_embedding_output`)."""
    meta = {p.key: p.value for p in model.metadata_props}
    # the task first: an encoder's classification head (``logits``) is checked by top-1
    for key, table in (("trtqat.task", TASK_METRICS), ("trtqat.family", FAMILY_METRICS)):
        if meta.get(key) in table:
            return table[meta[key]]
    if embedding:
        return "cosine"
    if outputs:
        shape = tuple(np.shape(outputs[0]))
    elif model.graph.output:
        shape = tuple(d.dim_value or -1 for d in model.graph.output[0].type.tensor_type.shape.dim)
    else:
        shape = ()
    return "top1" if len(shape) == 2 and shape[-1] != 1 else "cosine"


def input_ranges(model: onnx.ModelProto) -> dict[str, tuple[float, float]]:
    """Float inputs read by a QuantizeLinear -> the range its grid covers, ``(lo, hi)``."""
    found: dict[str, tuple[float, float]] = {}
    names = {v.name for v in model.graph.input}
    g = Graph(model)
    for node in model.graph.node:
        if node.op_type != "QuantizeLinear" or node.input[0] not in names:
            continue
        scale = g.const(node.input[1])
        zp = g.const(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        if scale is None or not np.isfinite(scale).all():
            continue
        kind = np.dtype(zp.dtype if zp is not None else np.uint8)
        if kind.kind not in "iu":
            continue
        info = np.iinfo(kind)
        z = zp.astype(np.float64) if zp is not None else np.zeros(1)
        s = np.abs(scale.astype(np.float64))
        lo, hi = float(((info.min - z) * s).min()), float(((info.max - z) * s).max())
        old = found.get(node.input[0])
        found[node.input[0]] = (lo, hi) if old is None else (min(lo, old[0]), max(hi, old[1]))
    return found


def _shape(spec: Any, given: Mapping[str, Sequence[int]]) -> tuple[int, ...]:
    if spec.name in given:
        return tuple(int(d) for d in given[spec.name])
    return tuple((DYNAMIC_BATCH if axis == 0 else DYNAMIC_DIM) if d is None else int(d)
                 for axis, d in enumerate(spec.shape))


def synthetic_check_feeds(model: onnx.ModelProto, options: Any = None
                          ) -> tuple[list[dict[str, np.ndarray]], dict[str, Any]]:
    """Seeded synthetic inputs for the agreement check of a model given no calibration
    inputs, and what they are: ``{"seed", "feeds", input name: {"shape", "dtype",
    "values"}}`` (the module's rules)."""
    given = {**dict(getattr(options, "shapes", None) or {}),
             **dict(getattr(options, "opt_shapes", None) or {})}
    specs = onnx_input_specs(model)
    shapes = {spec.name: _shape(spec, given) for spec in specs}
    batch = max([s[0] for s in shapes.values() if s] or [1])
    count = min(SAMPLES, max(1, math.ceil(SAMPLES / max(batch, 1))))
    ranges, bounds = input_ranges(model), index_input_bounds(model)
    described: dict[str, Any] = {"seed": SEED, "feeds": count}
    for spec in specs:
        dtype = np.dtype(spec.dtype)
        if dtype.kind == "f":
            lo, hi = ranges.get(spec.name, (None, None))
            values = ("standard normal (no input quantizer)" if lo is None else
                      f"normal in the input quantizer's range [{lo:.4g}, {hi:.4g}]")
        elif dtype.kind in "iu":
            low, top = spec.name.lower(), bounds.get(spec.name, SAFE_TOKEN_RANGE)
            values = ("ones" if "mask" in low else "zeros" if "token_type" in low
                      or "segment" in low else f"ids in [0, {top})")
        else:
            values = "random 0/1"
        described[spec.name] = {"shape": list(shapes[spec.name]), "dtype": dtype.name,
                                "values": values}
    rng = np.random.default_rng(SEED)
    feeds = []
    for _ in range(count):
        feed: dict[str, np.ndarray] = {}
        for spec in specs:
            dtype, shape = np.dtype(spec.dtype), shapes[spec.name]
            if dtype.kind == "f":
                lo, hi = ranges.get(spec.name, (None, None))
                if lo is None:
                    value = rng.standard_normal(shape)
                else:
                    value = np.clip(rng.normal((lo + hi) / 2, (hi - lo) / 6, shape), lo, hi)
                feed[spec.name] = value.astype(dtype)
            else:
                feed[spec.name] = rng.integers(0, 2, size=shape).astype(dtype)
        feeds.append(valid_integer_feed(feed, bounds, seed=int(rng.integers(1 << 31))))
    return feeds, described


def describe_inputs(described: Mapping[str, Any]) -> str:
    """One line for the log: ``2 synthetic feeds (seed 0): x float32 8x3x16x16 normal ...``."""
    parts = [f"{name} {d['dtype']} {'x'.join(str(n) for n in d['shape'])} {d['values']}"
             for name, d in described.items() if isinstance(d, Mapping)]
    return (f"{described.get('feeds')} synthetic feeds (seed {described.get('seed')}): "
            + "; ".join(parts))


__all__ = ["FAMILY_METRICS", "TASK_METRICS", "check_metric", "describe_inputs", "input_ranges",
           "synthetic_check_feeds"]
