"""What trtqat may delete or replace in a run folder: only the files it can prove it wrote.

The proof is the folder's manifest, ``.trtqat-manifest.json`` (written atomically), which lists
the names trtqat writes there; or, for a folder of an older trtqat without a manifest, the
content of its known files: ``args.yaml`` (a mapping of trtqat's options), ``metrics.jsonl``
(JSON records with a ``stage``), ``last.pt``/``best.pt`` (trtqat checkpoints, loaded with
``weights_only=True``), ``tb/`` (TensorBoard event files), ``*.onnx`` made by trtqat and its
``export.json``. Temporary files of trtqat's exact pattern (:func:`trtqat.atomic.is_temp_name`)
are its own too. Anything else is the user's: it is never moved or deleted, and a run folder
that holds it is refused (see :func:`trtqat.runs.run_dir.check_out_dir`).
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

from trtqat.atomic import is_temp_name, write_json

MANIFEST = ".trtqat-manifest.json"
MARKER = "trtqat-run-folder/1"
ASIDE = ".trtqat-replaced"  # the old run of an --overwrite, until the new one has a checkpoint
ARGS = "args.yaml"
METRICS = "metrics.jsonl"
CHECKPOINTS = ("last.pt", "best.pt")
TB = "tb"
_EVENTS = re.compile(r"^events\.out\.tfevents\.")
_LIMIT = 64 << 20  # text files larger than this are not trtqat's args or metrics


def read_manifest(folder: str | os.PathLike[str]) -> set[str]:
    """The names the manifest of ``folder`` lists (empty: no manifest, or a damaged one)."""
    try:
        data = json.loads((Path(folder) / MANIFEST).read_bytes())
    except (OSError, ValueError):
        return set()
    if not isinstance(data, dict) or data.get("format") != MARKER:
        return set()
    files = data.get("files")
    if not isinstance(files, list):
        return set()
    return {f for f in files if isinstance(f, str) and f not in ("", ".", "..")
            and "/" not in f and f not in (MANIFEST, ASIDE)}


def write_manifest(folder: str | os.PathLike[str], names: Iterable[str]) -> None:
    """Make the manifest of ``folder`` list ``names`` (atomically); none: no manifest."""
    names = sorted(set(names))
    path = Path(folder) / MANIFEST
    if not names:
        path.unlink(missing_ok=True)
        return
    write_json(path, {"format": MARKER, "note": "the files trtqat wrote in this folder: the "
                      "only ones it replaces or deletes", "files": names})


def claim(folder: str | os.PathLike[str], names: Iterable[str]) -> None:
    """Add ``names`` to the manifest of ``folder`` (before they are written)."""
    have = read_manifest(folder)
    names = set(names)
    if not names <= have or not (Path(folder) / MANIFEST).is_file():
        write_manifest(folder, have | names)


# ------------------------------------------------------------------ files of older versions
def _text(path: Path) -> str | None:
    try:
        if path.stat().st_size > _LIMIT:
            return None
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def _is_args(path: Path) -> bool:
    import yaml

    text = _text(path)
    try:
        data = yaml.safe_load(text) if text is not None else None
    except yaml.YAMLError:
        return False
    return isinstance(data, dict) and ({"out", "seed"} <= data.keys()
                                       or {"model", "family"} <= data.keys())


def _is_metrics(path: Path) -> bool:
    text = _text(path)
    if text is None:
        return False
    for line in filter(str.strip, text.splitlines()):
        try:
            rec = json.loads(line)
        except ValueError:
            return False
        if not isinstance(rec, dict) or "stage" not in rec:
            return False
    return True


def _is_checkpoint(path: Path) -> bool:
    import torch

    from trtqat.runs.checkpoint import FORMAT

    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # any failure to load: not a checkpoint of ours
        return False
    return isinstance(ckpt, dict) and (ckpt.get("format") == FORMAT
                                       or {"stage", "model", "state_dict"} <= ckpt.keys())


def _is_trtqat_onnx(path: Path) -> bool:
    try:  # the check of trtqat.export.result.is_trtqat_onnx (runs may not import export)
        import onnx

        return onnx.load(str(path), load_external_data=False).producer_name == "trtqat"
    except Exception:  # any parse failure: not an ONNX model of ours
        return False


def _is_export_summary(path: Path) -> bool:
    from trtqat.atomic import json_with_keys

    return json_with_keys("checkpoint", "variant", "results")(path)


KNOWN: tuple[tuple[str, Callable[[Path], bool]], ...] = (
    (ARGS, _is_args), (METRICS, _is_metrics), ("last.pt", _is_checkpoint),
    ("best.pt", _is_checkpoint), ("*.onnx", _is_trtqat_onnx), ("export.json", _is_export_summary))
"""Names trtqat writes into run folders, with the check that proves a file is its own."""


def _recognised(path: Path) -> bool:
    return path.is_file() and any(fnmatch.fnmatchcase(path.name, pattern) and check(path)
                                  for pattern, check in KNOWN)


# ------------------------------------------------------------------ a folder's entries
def _skipped(folder: Path, name: str) -> bool:
    """The manifest, the aside folder, trtqat temp files, and the lock of a sub-run folder."""
    if name in (MANIFEST, ASIDE) or is_temp_name(name):
        return True
    return (name.startswith(".") and name.endswith(".lock")
            and (folder / name[1:-len(".lock")]).is_dir())


def foreign_in_tb(folder: Path) -> list[str]:
    """What ``folder/tb`` holds besides TensorBoard event files (names relative to ``folder``)."""
    tb = folder / TB
    if not tb.is_dir() or tb.is_symlink():
        return [TB]
    found = []
    for root, _dirs, files in os.walk(tb):
        for name in sorted(files):
            if not _EVENTS.match(name):
                found.append(str((Path(root) / name).relative_to(folder)))
    return found


def entries(folder: str | os.PathLike[str]) -> tuple[list[str], list[str]]:
    """``(ours, foreign)``: the names in ``folder`` trtqat can prove it wrote, and the rest
    (a ``tb/`` folder counts as ours when it holds only event files; else its other files
    are named). Skipped: the manifest, the aside folder, temp files, locks."""
    folder = Path(folder)
    listed = read_manifest(folder)
    ours: list[str] = []
    foreign: list[str] = []
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return ours, foreign
    for name in names:
        path = folder / name
        if _skipped(folder, name):
            continue
        if name == TB:
            other = foreign_in_tb(folder)
            (foreign.extend(other) if other else ours.append(name))
        elif (name in listed and path.is_file()) or _recognised(path):
            ours.append(name)
        else:
            foreign.append(name + ("/" if path.is_dir() else ""))
    return ours, foreign


def remove_ours(folder: Path, name: str) -> None:
    """Remove entry ``name`` of ``folder`` as trtqat wrote it: a file, or the event files of
    ``tb/`` (and its folders, once empty); other files in ``tb/`` stay."""
    path = folder / name
    if name != TB or not path.is_dir() or path.is_symlink():
        if path.is_file() or path.is_symlink():
            path.unlink(missing_ok=True)
        return
    for root, _dirs, files in os.walk(path, topdown=False):
        for f in files:
            if _EVENTS.match(f):
                (Path(root) / f).unlink(missing_ok=True)
        try:
            os.rmdir(root)
        except OSError:
            pass


def remove_tree(path: Path) -> None:
    """Remove the aside folder (it holds only what trtqat moved into it)."""
    shutil.rmtree(path, ignore_errors=True)
