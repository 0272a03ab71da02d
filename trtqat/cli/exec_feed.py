"""The inputs ``trtqat-exec`` runs with: its flags (``--shapes``, ``--loadInputs``) read
into the library's feed (:func:`trtqat.engines.feeds.engine_feed`: random data like
trtexec's, valid ids for the integer inputs of encoders, loaded files in their place), and
the ``--calibInputs`` file read into calibration feeds."""

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


def load_calib_inputs(path: str, onnx_path: str | None = None) -> tuple[dict, ...]:
    """Calibration feeds from an .npz file: one feed per 8 samples of the arrays.

    Arrays are named after the model's inputs; a file with a single array feeds a model with
    a single input whatever its name (as --loadInputs). NaN/inf values are refused."""
    import zipfile

    import numpy as np

    from trtqat.engines import OptionsError
    from trtqat.engines.trtexec_io import check_finite_input

    try:
        data = np.load(path, allow_pickle=False)
        if isinstance(data, np.ndarray):  # a .npy: one array, for a model with one input
            arrays = {"array": data}
        else:
            with data:
                arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        from trtqat.arrays import reason_of

        raise OptionsError(f"--calibInputs: cannot read {path} ({reason_of(exc)}); save arrays with "
                           "numpy.savez(path, input_name=array)") from None
    if not arrays or len({len(a) if a.ndim else -1 for a in arrays.values()}) != 1 or any(
            a.ndim == 0 or len(a) == 0 for a in arrays.values()):
        raise OptionsError(f"--calibInputs: {path} must hold arrays with one common batch "
                           "size (at least one sample)")
    arrays = _named_after_inputs(path, arrays, onnx_path)
    for name, array in arrays.items():
        check_finite_input("--calibInputs", path, name, array)
    n = len(next(iter(arrays.values())))
    return tuple({k: v[i:i + 8] for k, v in arrays.items()} for i in range(0, n, 8))


def _named_after_inputs(path: str, arrays: dict, onnx_path: str | None) -> dict:
    """``arrays`` keyed by the model's input names (a lone array takes the lone input's)."""
    from trtqat.engines import OptionsError

    if not onnx_path:
        return arrays
    try:
        import onnx

        graph = onnx.load(onnx_path, load_external_data=False).graph
    except Exception:  # the build reports an unreadable model in its own words
        return arrays
    weights = {init.name for init in graph.initializer}
    names = [v.name for v in graph.input if v.name not in weights]
    if len(arrays) == 1 and len(names) == 1:
        return {names[0]: next(iter(arrays.values()))}
    unknown = sorted(set(arrays) - set(names))
    missing = sorted(set(names) - set(arrays))
    if unknown or missing:
        raise OptionsError(f"--calibInputs: {path} holds {', '.join(sorted(arrays))}; the "
                           f"model's inputs are {', '.join(names)}: save one array per input, "
                           "named after it")
    return arrays
