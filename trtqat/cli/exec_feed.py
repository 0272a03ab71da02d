"""The inputs ``trtqat-exec`` runs with: its flags (``--shapes``, ``--loadInputs``) read
into the library's feed (:func:`trtqat.engines.feeds.engine_feed`: random data like
trtexec's, valid ids for the integer inputs of encoders, loaded files in their place)."""

from __future__ import annotations

import argparse
from typing import Any

from trtqat.engines.feeds import valid_integer_feed  # noqa: F401 (its earlier home)


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


def feed_args(args: argparse.Namespace, engine: Any) -> tuple[dict, dict]:
    """``(shapes, loaded arrays)`` of ``--shapes`` and ``--loadInputs``."""
    from trtqat.engines import parse_shapes
    from trtqat.engines.trtexec_io import load_inputs, parse_name_files

    shapes = parse_shapes(args.shapes) if args.shapes else {}
    loaded = (load_inputs(parse_name_files(args.loadInputs), engine.inputs, shapes)
              if args.loadInputs else {})
    return shapes, loaded


def make_feed(args: argparse.Namespace, engine: Any) -> dict:
    """Random inputs (valid ids for integer inputs) at the run shapes, then --loadInputs."""
    from trtqat.engines.feeds import engine_feed

    shapes, loaded = feed_args(args, engine)
    return engine_feed(engine, shapes, loaded, onnx_path=args.onnx)
