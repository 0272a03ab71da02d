"""The inputs ``trtqat-exec`` runs with: random data like trtexec's (valid ids for integer
inputs of encoders) at the run shapes, replaced by ``--loadInputs`` files where given."""

from __future__ import annotations

import argparse
from typing import Any

# Fallback range of token-id inputs whose embedding table cannot be found (the tokenizers
# of the BERT family have far more than 1000 ids).
_SAFE_TOKEN_RANGE = 1000


def _index_bounds(args: argparse.Namespace, engine: Any) -> dict[str, int]:
    """Row counts of the embedding tables the integer inputs index (ONNX or ORT engine)."""
    import onnx

    from trtqat.engines.onnx_io import index_input_bounds
    from trtqat.engines.registry import backend_info

    try:
        if args.onnx:
            model = onnx.load(args.onnx, load_external_data=False)
        elif backend_info(engine.backend).onnx_payload:
            model = onnx.load_from_string(engine.payload)
        else:
            return {}
    except Exception:  # best effort: the fallback range applies
        return {}
    return index_input_bounds(model)


def valid_integer_feed(feed: dict, bounds: dict[str, int], seed: int = 0) -> dict:
    """Make random integer inputs valid for encoders: ``*mask*`` inputs all ones,
    ``token_type``/``segment`` inputs zeros, other integer inputs (token ids) uniform in
    ``[0, bound)`` (the embedding table's rows, else ``[0, 1000)``). Float and bool inputs
    are kept."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = dict(feed)
    for name, array in feed.items():
        if array.dtype.kind not in "iu":
            continue
        low = name.lower()
        if "mask" in low:
            out[name] = np.ones_like(array)
        elif "token_type" in low or "segment" in low:
            out[name] = np.zeros_like(array)
        else:
            high = bounds.get(name, _SAFE_TOKEN_RANGE)
            out[name] = rng.integers(0, max(1, high), size=array.shape).astype(array.dtype)
    return out


def precheck_input_files(args: argparse.Namespace) -> None:
    """``--loadInputs`` checked before the build: syntax, files, and (from ``--onnx``) the
    input names."""
    from trtqat.engines.trtexec_io import check_input_files

    names = None
    if args.onnx:
        import onnx

        try:
            graph = onnx.load(args.onnx, load_external_data=False).graph
        except Exception:  # the build reports an unreadable model in its own words
            graph = None
        if graph is not None:
            weights = {init.name for init in graph.initializer}
            names = [v.name for v in graph.input if v.name not in weights]
    check_input_files(args.loadInputs, names)


def make_feed(args: argparse.Namespace, engine: Any) -> dict:
    """Random inputs (valid ids for integer inputs) at the run shapes, then --loadInputs."""
    from trtqat.engines import parse_shapes, random_feed
    from trtqat.engines.trtexec_io import load_inputs, parse_name_files

    shapes = parse_shapes(args.shapes) if args.shapes else {}
    loaded = (load_inputs(parse_name_files(args.loadInputs), engine.inputs, shapes)
              if args.loadInputs else {})
    feed = random_feed(engine.inputs, {**shapes, **{k: v.shape for k, v in loaded.items()}})
    if any(a.dtype.kind in "iu" for a in feed.values()):
        feed = valid_integer_feed(feed, _index_bounds(args, engine))
    return {**feed, **loaded}
