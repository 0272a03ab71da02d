"""trtexec's input and report files: --loadInputs, --exportOutput, --exportProfile and
--exportLayerInfo, in the JSON shapes trtexec writes.

* ``--loadInputs=name:file,...``: raw binary (trtexec's format: the tensor's bytes, C order,
  sized by the run shape), or ``.npy`` / ``.npz`` (the array named after the input, or the
  only array). Inputs not named get random data, as in trtexec.
* ``--exportOutput``: ``[{"name": ..., "dimensions": "1x1000", "values": [...]}, ...]``.
* ``--exportProfile``: ``[{"count": N}, {"name": ..., "timeMs": ..., "averageMs": ...,
  "percentage": ...}, ...]``.
* ``--exportLayerInfo``: ``{"Layers": [...], "Bindings": [...]}`` (layer names, or one
  object per layer with ``--profilingVerbosity=detailed``).
"""

from __future__ import annotations

import logging
import math
import os
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from trtqat.atomic import write_json
from trtqat.engines.errors import InputError, OptionsError
from trtqat.engines.specs import Shape, TensorSpec, format_shape

log = logging.getLogger(__name__)


def parse_name_files(text: str, flag: str = "--loadInputs") -> dict[str, Path]:
    """``x:in.bin,'a:b':y.npy`` -> ``{"x": Path("in.bin"), "a:b": Path("y.npy")}``.

    A name holding ``:`` is quoted, as in trtexec; the file is what follows the first
    ``:`` after the name.
    """
    out: dict[str, Path] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        if item[0] in "'\"":
            end = item.find(item[0], 1)
            name, rest = (item[1:end], item[end + 1:]) if end > 0 else ("", "")
            sep, file = rest[:1], rest[1:]
        else:
            name, sep, file = item.partition(":")
        if sep != ":" or not name or not file:
            raise OptionsError(f"{flag}: '{item}' is not name:file; write e.g. "
                               f"{flag}=input:input.bin")
        if name in out:
            raise OptionsError(f"{flag}: input '{name}' is given twice; give each input once")
        out[name] = Path(file)
    if not out:
        raise OptionsError(f"{flag}: no files given; write e.g. {flag}=input:input.bin")
    return out


def _read_array(name: str, path: Path) -> np.ndarray | None:
    """An .npy/.npz array, or None for a raw binary file."""
    suffix = path.suffix.lower()
    if suffix not in (".npy", ".npz"):
        return None
    try:
        if suffix == ".npy":
            return np.load(path, allow_pickle=False)
        with np.load(path, allow_pickle=False) as data:
            if name in data.files:
                return data[name]
            if len(data.files) == 1:
                return data[data.files[0]]
            raise OptionsError(f"--loadInputs: {path} holds {', '.join(data.files)}, none named "
                               f"'{name}'; save it with numpy.savez(path, {name}=array)")
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        from trtqat.arrays import reason_of

        raise OptionsError(f"--loadInputs: cannot read {path} as {suffix} ({reason_of(exc)}); save it "
                           f"with numpy.{'save' if suffix == '.npy' else 'savez'}") from None


def check_input_files(text: str, input_names: Sequence[str] | None = None) -> dict[str, Path]:
    """Check ``--loadInputs`` before any build: its syntax, that every file exists, and
    (when the model's ``input_names`` are known) that every name is an input."""
    files = parse_name_files(text)
    for name, path in files.items():
        if input_names is not None and name not in input_names:
            raise InputError(f"--loadInputs: unknown input '{name}'; the model's inputs are: "
                             f"{', '.join(input_names)}")
        if not path.is_file():
            raise OptionsError(f"--loadInputs: file {path} for input '{name}' does not exist")
    return files


def load_inputs(files: Mapping[str, Path], inputs: Sequence[TensorSpec],
                shapes: Mapping[str, Shape]) -> dict[str, np.ndarray]:
    """Arrays for the inputs named in ``files``; raw files take the run shape (``shapes``,
    else the input's default shape) and must hold exactly that many bytes."""
    specs = {spec.name: spec for spec in inputs}
    feed = {}
    for name, path in files.items():
        spec = specs.get(name)
        if spec is None:
            raise InputError(f"--loadInputs: unknown input '{name}'; the engine's inputs are: "
                             f"{', '.join(specs)}")
        if not path.is_file():
            raise OptionsError(f"--loadInputs: file {path} for input '{name}' does not exist")
        shape = tuple(shapes.get(name, spec.default_shape()))
        array = _read_array(name, path)
        if array is None:
            dtype = np.dtype(spec.dtype)
            need = int(np.prod(shape)) * dtype.itemsize
            size = path.stat().st_size
            if size != need:
                raise InputError(f"--loadInputs: {path} has {size} bytes, input '{name}' "
                                 f"({spec.dtype} {format_shape(shape)}) needs {need}; give "
                                 "--shapes for the run shape, or a file of that size")
            array = np.fromfile(path, dtype=dtype).reshape(shape)
        elif name in shapes and tuple(array.shape) != shape:
            raise InputError(f"--loadInputs: {path} holds {format_shape(array.shape)} for input "
                             f"'{name}', but --shapes asks for {format_shape(shape)}")
        check_finite_input("--loadInputs", path, name, array)
        feed[name] = array
    return feed


def check_finite_input(flag: str, path: str | os.PathLike[str], name: str,
                       array: np.ndarray) -> None:
    """Refuse an input array holding NaN or infinity, naming it (InputError)."""
    from trtqat.finite import first_non_finite

    found = first_non_finite([(name, array)])
    if found is not None:
        raise InputError(f"{flag}: {path} holds {found[1]} NaN/inf value(s) of {found[2]} for "
                         f"input '{name}'; engines are measured on finite data: fix the file")


def _write_json(path: str | os.PathLike[str], data: Any) -> Path:
    return write_json(path, data)


def _json_values(array: np.ndarray) -> list:
    """Flat values for JSON: NaN and infinity (not JSON) become null."""
    flat = np.asarray(array).ravel()
    if flat.dtype.kind in "fc" and not np.isfinite(flat).all():
        return [v if math.isfinite(v) else None for v in flat.astype(np.float64).tolist()]
    return flat.tolist()


def export_outputs(outputs: Mapping[str, np.ndarray], path: str | os.PathLike[str]) -> Path:
    """trtexec's --exportOutput JSON: name, ``dimensions`` (``1x1000``) and flat values.

    NaN and infinity, which JSON cannot hold (trtexec writes bare ``nan``), are written as
    ``null``, with one warning per output that holds them."""
    from trtqat.finite import first_non_finite

    for name, array in outputs.items():
        found = first_non_finite([(name, array)])
        if found is not None:
            log.warning("--exportOutput: output '%s' holds %d NaN/inf value(s) of %d, written "
                        "as null (the engine or its inputs are not finite)", *found)
    return _write_json(path, [{"name": name, "dimensions": format_shape(array.shape),
                               "values": _json_values(array)}
                              for name, array in outputs.items()])


def export_profile(layers: Mapping[str, float], iterations: int,
                   path: str | os.PathLike[str]) -> Path:
    """trtexec's --exportProfile JSON from mean ms per layer over ``iterations`` runs."""
    total = sum(layers.values()) or 1.0
    records: list[dict[str, Any]] = [{"count": iterations}]
    records += [{"name": name, "timeMs": ms * iterations, "averageMs": ms,
                 "percentage": 100.0 * ms / total} for name, ms in layers.items()]
    return _write_json(path, records)


def export_layer_info(info: Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    """trtexec's --exportLayerInfo JSON (``{"Layers": [...], "Bindings": [...]}``)."""
    return _write_json(path, dict(info))


# ---------------------------------------------------------------- recognising earlier reports
# trtexec's --exportTimes record; an earlier --exportTimes file holds a list of them
TIMES_KEYS = frozenset({"startEnqMs", "endEnqMs", "startComputeMs", "endComputeMs",
                        "computeMs", "latencyMs"})
_MAX_REPORT_BYTES = 256 << 20  # larger files are not recognised (so not overwritten)


def _records(data: Any, keys: set[str]) -> bool:
    return (isinstance(data, list) and bool(data)
            and all(isinstance(r, dict) and keys <= set(r) for r in data))


def report_kind(path: str | os.PathLike[str]) -> str | None:
    """What trtexec-style report ``path`` holds, by its content: ``"times"``
    (--exportTimes), ``"outputs"`` (--exportOutput), ``"profile"`` (--exportProfile),
    ``"layers"`` (--exportLayerInfo), or None for anything else (an engine's sidecar, a run's
    export.json or metrics.jsonl, compare's report.json, a damaged or huge file ...)."""
    import json

    try:
        if os.path.getsize(path) > _MAX_REPORT_BYTES:
            return None
        with open(path, "rb") as f:
            data = json.loads(f.read())
    except (OSError, ValueError):
        return None
    if _records(data, set(TIMES_KEYS)):
        return "times"
    if _records(data, {"name", "dimensions", "values"}):
        return "outputs"
    if (isinstance(data, list) and data and isinstance(data[0], dict)
            and set(data[0]) == {"count"} and (len(data) == 1 or _records(
                data[1:], {"name", "timeMs", "averageMs", "percentage"}))):
        return "profile"
    if isinstance(data, dict) and {"Layers", "Bindings"} <= set(data) and all(
            isinstance(data[k], list) for k in ("Layers", "Bindings")):
        return "layers"
    return None


def layer_info_lines(info: Mapping[str, Any]) -> list[str]:
    """One line per layer, for --dumpLayerInfo."""
    lines = []
    for layer in info.get("Layers", []):
        if not isinstance(layer, Mapping):
            lines.append(str(layer))
            continue
        ins = ", ".join(str(t.get("Name", t)) if isinstance(t, Mapping) else str(t)
                        for t in layer.get("Inputs", []))
        outs = ", ".join(str(t.get("Name", t)) if isinstance(t, Mapping) else str(t)
                         for t in layer.get("Outputs", []))
        lines.append(f"{layer.get('Name')} [{layer.get('LayerType', '?')}]: {ins} -> {outs}")
    lines.append(f"Bindings: {', '.join(map(str, info.get('Bindings', [])))}")
    return lines
