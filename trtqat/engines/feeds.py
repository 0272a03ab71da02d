"""The inputs an engine is timed with: random data like trtexec's at the run shapes, valid
ids for the integer inputs of encoders, replaced by real arrays where given."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from trtqat.engines.errors import InputError
from trtqat.engines.id_inputs import SAFE_TOKEN_RANGE, valid_integer_feed  # noqa: F401
from trtqat.engines.specs import Shape, check_shapes
from trtqat.finite import describe, first_non_finite

if TYPE_CHECKING:
    from trtqat.engines.base import Engine


def index_bounds(engine: Engine, onnx_path: str | os.PathLike[str] | None = None
                 ) -> dict[str, int]:
    """Row counts of the embedding tables the integer inputs index, read from ``onnx_path``
    or from the engine when its file holds an ONNX model (best effort: {} otherwise)."""
    import onnx

    from trtqat.engines.onnx_io import index_input_bounds
    from trtqat.engines.registry import backend_info

    try:
        if onnx_path:
            model = onnx.load(str(onnx_path), load_external_data=False)
        elif backend_info(engine.backend).onnx_payload:
            model = onnx.load_from_string(engine.payload)
        else:
            return {}
    except Exception:  # best effort: the fallback range applies
        return {}
    return index_input_bounds(model)


def engine_feed(engine: Engine, shapes: Mapping[str, Shape] | None = None,
                inputs: Mapping[str, Any] | None = None,
                onnx_path: str | os.PathLike[str] | None = None) -> dict[str, np.ndarray]:
    """The feed ``trtqat-exec`` times: random inputs at ``shapes`` (else each input's
    default shape; integer inputs made valid token ids, masks and segments), then the real
    arrays of ``inputs`` (by input name) in their place."""
    from trtqat.engines.base import random_feed

    given = {name: np.asarray(value) for name, value in (inputs or {}).items()}
    found = first_non_finite(given.items())
    if found is not None:
        raise InputError(f"input {describe(found)}; engines are timed and checked on finite "
                         "data: fix the input")
    shapes = check_shapes(shapes)
    names = [spec.name for spec in engine.inputs]
    for what, named in (("--shapes: ", shapes), ("", given)):
        unknown = sorted(set(named) - set(names))
        if unknown:
            raise InputError(f"{what}unknown input '{unknown[0]}'; the engine's inputs are: "
                             f"{', '.join(sorted(names))}")
    missing = [spec for spec in engine.inputs if spec.name not in given]
    feed = random_feed(missing, {k: v for k, v in shapes.items() if k not in given})
    if any(a.dtype.kind in "iu" for a in feed.values()):
        feed = valid_integer_feed(feed, index_bounds(engine, onnx_path))
    return {name: given[name] if name in given else feed[name] for name in names}
