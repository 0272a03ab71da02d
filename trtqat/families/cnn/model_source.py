"""Models from anywhere: a torchvision name, a timm name, ``path/to/file.py:factory``, or
an Ultralytics classifier's ``.yaml``/``.pt`` (:mod:`.ultralytics_cls`).

``build(source, num_classes, quantized)`` gives the ``nn.Module``; ``load_weights`` fills it
from a plain ``state_dict`` file, a full checkpoint file (a dict holding ``state_dict``,
``model``, ...) or torchvision's named weights found in the local torch hub cache (never
downloaded). ``describe`` records where a model came from (source, file and weights with
their SHA-256) so a checkpoint can rebuild it alone.

Quantized torchvision models keep the ``quant_modules`` route of :mod:`trtqat.families.cnn.models`
(with residual quantizers); timm and file models are built in float and converted in place
with :func:`trtqat.quant.model_ops.quantize`.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
from torch import nn

from trtqat.families.cnn.model_file import (
    ModelSourceError,
    executed_sha256,
    import_verified,
    module_name,
)
from trtqat.families.model_paths import probe
from trtqat.outputs import select

log = logging.getLogger(__name__)

FILE_SOURCE = re.compile(r"^(?P<file>.+\.py):(?P<factory>[A-Za-z_]\w*)$")
STATE_KEYS = ("state_dict", "model_state_dict", "model", "state_dict_ema", "model_ema",
              "module", "net", "weights")
SHOWN_KEYS = 3
_QUANTIZER_KEY = re.compile(r"(^|\.)\w*_quantizers?(_\d+)?\.")  # a quantizer's buffer


# --------------------------------------------------------------------------- sources
def kind_of(source: str) -> str:
    """``file``, ``timm``, ``torchvision`` or ``ultralytics`` (:class:`ModelSourceError` for
    unknown names)."""
    from trtqat.families.cnn import ultralytics_cls

    if FILE_SOURCE.match(source):
        return "file"
    if ultralytics_cls.is_classifier(source):
        return ultralytics_cls.KIND
    if source.endswith(".py"):
        raise ModelSourceError(f"--model {source}: name the factory function too, as "
                               f"{source}:make_model (a function returning an nn.Module)")
    if source.startswith("timm:"):
        return "timm"
    from trtqat.families.cnn.models import classification_models

    if source in classification_models():
        return "torchvision"
    timm = _timm(required=False)
    if timm is not None and timm.is_model(source):
        return "timm"
    from trtqat.families.cnn.models import UnknownModelError, _check_name

    try:
        _check_name(source)  # raises with close torchvision names
    except UnknownModelError as exc:
        hint = ("" if timm is not None else "; for a timm model, pip install 'trtqat[timm]'")
        raise UnknownModelError(f"{exc} (or a timm name, or path/to/file.py:factory{hint})"
                                ) from None
    return "torchvision"


def arch_name(source: str) -> str:
    """A short, file-name-safe name of the model (``my_net.make`` for a file source)."""
    m = FILE_SOURCE.match(source)
    if m:
        return f"{Path(m['file']).stem}.{m['factory']}"
    if Path(source).suffix.lower() in (".yaml", ".yml", ".pt"):
        return re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(source).stem)  # yolo11n-cls
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", source.removeprefix("timm:"))


def sha256(path: str | Path) -> str:
    """Hex SHA-256 of a file."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _timm(required: bool = True):
    try:
        import timm
    except ImportError:
        if required:
            raise ModelSourceError("timm is not installed: pip install 'trtqat[timm]' to use "
                                   "timm models") from None
        return None
    return timm


def _load_factory(source: str, expected_sha256: str | None = None):
    m = FILE_SOURCE.match(source)
    path, factory = Path(m["file"]), m["factory"]
    if probe(path) != "file":
        raise ModelSourceError(f"--model {source}: model file {path} does not exist")
    module = import_verified(path, expected_sha256)  # its bytes, never a .pyc
    name = module_name(path)
    fn = getattr(module, factory, None)
    if not callable(fn):
        found = [k for k, v in vars(module).items()
                 if inspect.isfunction(v) and v.__module__ == name and not k.startswith("_")]
        raise ModelSourceError(f"model file {path} has no function {factory!r}; it defines "
                               f"{', '.join(found) or 'no public functions'}")
    return fn, path


def _accepts_num_classes(fn) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "num_classes" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _build_file(source: str, num_classes: int | None, expected_sha256: str | None) -> nn.Module:
    fn, path = _load_factory(source, expected_sha256)
    kwargs = {"num_classes": num_classes} if num_classes and _accepts_num_classes(fn) else {}
    try:
        model = fn(**kwargs)
    except Exception as exc:
        raise ModelSourceError(f"{path}:{fn.__name__}({', '.join(f'{k}={v}' for k, v in kwargs.items())}) "
                               f"raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                               ) from None
    if not isinstance(model, nn.Module):
        raise ModelSourceError(f"{path}:{fn.__name__}() returned a {type(model).__name__}, not a "
                               "torch.nn.Module: make the factory return the model")
    return model


def build(source: str, num_classes: int | None = None, quantized: bool = False,
          expected_sha256: str | None = None, record: dict[str, Any] | None = None,
          channels: int | None = None) -> nn.Module:
    """The model ``source`` names, randomly initialised, float or fake-quantized.

    ``num_classes=None`` keeps the model's own head (1000 for torchvision/timm, whatever a
    factory builds); a factory gets ``num_classes=`` only if it takes that argument.
    ``expected_sha256``: a model file's recorded digest (:func:`recorded_sha256`); the bytes
    that would be executed are refused when they differ. ``record``: a checkpoint's
    ``model.source`` (an Ultralytics classifier's yaml builds it); ``channels``: the input
    channels of a model built from a yaml.
    """
    from trtqat.families.cnn import ultralytics_cls
    from trtqat.families.cnn.models import QUANT_DESC_INPUT, build_model

    record = record or {}
    kind = ultralytics_cls.KIND if record.get("kind") == ultralytics_cls.KIND else kind_of(source)
    if kind == "torchvision":
        return build_model(source, num_classes or 1000, quantized=quantized)
    if kind == ultralytics_cls.KIND:
        model = ultralytics_cls.build(source, num_classes, record.get("yaml"), channels)
    elif kind == "timm":
        kwargs = {"num_classes": num_classes} if num_classes else {}
        model = _timm().create_model(source.removeprefix("timm:"), pretrained=False, **kwargs)
    else:
        model = _build_file(source, num_classes, expected_sha256)
    if quantized:
        from trtqat.quant.model_ops import QuantConfig, quantize

        quantize(model, QuantConfig(quant_desc_input=QUANT_DESC_INPUT))
    return model


# --------------------------------------------------------------------------- weights
def _named_torchvision_weights(source: str, weights: str):
    """torchvision's ``Weights`` enum member that ``weights`` names, or None."""
    import torchvision

    try:
        enum = torchvision.models.get_model_weights(source)
    except (ValueError, KeyError):
        return None
    member = weights.split(".")[-1]
    if member == "DEFAULT":
        return enum.DEFAULT
    return enum.__members__.get(member)


def _cached_file(weight) -> Path:
    folder = Path(torch.hub.get_dir()) / "checkpoints"
    path = folder / Path(urlparse(weight.url).path).name
    if not path.is_file():
        raise ModelSourceError(f"torchvision weights {weight} are not in the local cache "
                               f"({path}): trtqat never downloads; copy the file there, or pass "
                               "--weights FILE.pt")
    return path


def resolve_weights(source: str, weights: str) -> Path:
    """The file behind ``--weights``: a path, or a cached torchvision named weight."""
    path = Path(weights)
    if probe(path) == "file":
        return path
    if kind_of(source) == "torchvision" and "/" not in weights and \
            path.suffix.lower() not in (".pt", ".pth", ".bin", ".ckpt", ".tar"):
        named = _named_torchvision_weights(source, weights)
        if named is not None:
            return _cached_file(named)
    raise ModelSourceError(f"--weights {weights}: no such file (a state_dict or checkpoint "
                           ".pt/.pth, or for torchvision models a weights name such as "
                           "IMAGENET1K_V1 found in the torch hub cache)")


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of a weights file: a plain ``state_dict`` or a checkpoint holding one.

    Loaded with ``weights_only=True``; a ``module.`` prefix (DataParallel) is removed.
    """
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch's text advises an unsafe load: never relayed
        from trtqat.runs.pickled import reason

        raise ModelSourceError(f"cannot read weights {path}: {reason(exc)}") from None
    for _ in range(3):  # nested checkpoints: {"model": {"state_dict": ...}}
        if not isinstance(obj, dict) or all(isinstance(v, torch.Tensor) for v in obj.values()):
            break
        key = next((k for k in STATE_KEYS if isinstance(obj.get(k), dict)), None)
        if key is None:
            break
        obj = obj[key]
    if not isinstance(obj, dict) or not obj:
        raise ModelSourceError(f"{path} holds no state_dict (a dict of tensors, or a "
                               f"checkpoint with one of the keys {', '.join(STATE_KEYS[:4])})")
    tensors = {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
    if not tensors:
        raise ModelSourceError(f"{path} holds a dict without tensors "
                               f"(keys {', '.join(list(obj)[:SHOWN_KEYS])}): not a state_dict")
    if all(k.startswith("module.") for k in tensors):
        tensors = {k.removeprefix("module."): v for k, v in tensors.items()}
    return tensors


def is_quantizer_key(key: str) -> bool:
    """True for the buffers of a TensorQuantizer (absent from float weights), also of the
    numbered quantizers placement adds (``pool_quantizer_1``) and quantizer lists."""
    return _QUANTIZER_KEY.search(key) is not None


def _few(keys: list[str]) -> str:
    more = f" and {len(keys) - SHOWN_KEYS} more" if len(keys) > SHOWN_KEYS else ""
    return ", ".join(keys[:SHOWN_KEYS]) + more


def fit_state_dict(model: nn.Module, state: dict[str, torch.Tensor], what: str,
                   hint: str = "", allow_missing: frozenset[str] = frozenset()) -> None:
    """Load ``state`` into ``model`` (quantizer buffers may be absent); a clear error lists a
    few missing, unexpected and wrongly shaped keys. ``what`` names the weights' origin."""
    own = model.state_dict()
    shapes = [f"{k} {tuple(v.shape)} vs {tuple(own[k].shape)}" for k, v in state.items()
              if k in own and own[k].shape != v.shape]
    missing = [k for k in own if k not in state and not is_quantizer_key(k)
               and k not in allow_missing]
    unexpected = [k for k in state if k not in own and not is_quantizer_key(k)]
    if not (shapes or missing or unexpected):  # quantizers create amax buffers while loading
        unexpected = list(model.load_state_dict(state, strict=False).unexpected_keys)
    if shapes or missing or unexpected:
        parts = [f"{name} {_few(keys)}" for name, keys in
                 (("missing", missing), ("unexpected", unexpected), ("shape (file vs model)",
                                                                      shapes)) if keys]
        raise ModelSourceError(f"{what} does not fit the model: {'; '.join(parts)}"
                               f"{hint or ''}")


def _mismatched_head(model: nn.Module, state: dict[str, torch.Tensor]) -> frozenset[str]:
    """Keys of the last Linear/Conv layer (the classifier head) whose shapes differ."""
    head = None
    for name, module in model.named_modules():
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            head = name
    own = model.state_dict()
    return frozenset(k for k, v in state.items() if head is not None
                     and k.rpartition(".")[0] == head and k in own and own[k].shape != v.shape)


def load_weights(model: nn.Module, source: str, weights: str, new_head: bool = False
                 ) -> dict[str, Any]:
    """Fill ``model`` from ``--weights``; returns ``{"weights", "weights_sha256"}``.

    ``new_head`` (fine-tuning to another class count) leaves a classifier head whose shape
    differs at its random initialisation, with a warning.
    """
    path = resolve_weights(source, weights)
    state = read_state_dict(path)
    head = _mismatched_head(model, state) if new_head else frozenset()
    if head:
        log.warning("weights %s: %s has another class count; it starts from random values",
                    path, ", ".join(sorted(head)))
        state = {k: v for k, v in state.items() if k not in head}
    # the class-count hint only where the classifier head is what differs
    hint = (" (another class count? pass --num-classes N)" if _mismatched_head(model, state)
            else " (weights of another model? --weights takes the float weights of --model)")
    fit_state_dict(model, state, f"weights {path}", hint, allow_missing=head)
    return {"weights": str(path.resolve()), "weights_sha256": sha256(path)}


# --------------------------------------------------------------------------- records
def describe(source: str) -> dict[str, Any]:
    """``{"model", "kind"[, "file", "file_sha256"]}``: enough to rebuild the model (the
    digest of the bytes that were executed, when the file was imported already)."""
    from trtqat.families.cnn import ultralytics_cls

    kind = kind_of(source)
    info: dict[str, Any] = {"model": source, "kind": kind}
    if kind == ultralytics_cls.KIND:
        return ultralytics_cls.describe(source)
    if kind == "file":
        path = Path(FILE_SOURCE.match(source)["file"]).resolve()
        info.update(model=f"{path}:{FILE_SOURCE.match(source)['factory']}", file=str(path),
                    file_sha256=executed_sha256(path) or sha256(path))
    return info


def source_of(spec: dict[str, Any]) -> str:
    """The model source a checkpoint's ``model`` spec records (its arch for older ones).

    A source that is a model file (``FILE.py:factory``) is imported only if it is the file
    the checkpoint recorded, unchanged (same SHA-256): a checkpoint never runs code the user
    did not choose. Otherwise :class:`ModelSourceError`, unless ``--trust-model-file``
    (:func:`trtqat.runopts.trusting_model_files`)."""
    rec = spec.get("source") or {}
    # a torchvision arch is its own source; timm and file sources have a short arch
    own = ("file", "timm", "ultralytics")
    source = rec.get("model") if rec.get("kind") in own else spec["arch"]
    recorded_sha256(str(source), rec)
    return str(source)


def recorded_sha256(source: str, rec: dict[str, Any]) -> str | None:
    """The SHA-256 a model file source must have to be imported from a checkpoint's record
    ``rec`` (None: not a file source, or ``--trust-model-file``); pass it to :func:`build`.
    :class:`ModelSourceError` when the record names another file or no digest."""
    from trtqat.runopts import model_files_trusted

    match = FILE_SOURCE.match(source)
    if match is None or model_files_trusted():
        return None
    path = Path(match["file"])
    recorded = rec.get("file_sha256")
    if probe(path) != "file":  # refused when built ("" matches no file, should one appear)
        return recorded if isinstance(recorded, str) else ""
    same_file = bool(rec.get("file")) and Path(str(rec["file"])).resolve() == path.resolve()
    if same_file and isinstance(recorded, str):
        return recorded  # compared with the very bytes that are executed
    why = "is not recorded with its SHA-256 in the checkpoint"
    raise ModelSourceError(f"the checkpoint builds its model by importing {path}, which {why}: "
                           "importing it would run code you have not checked; restore the "
                           "file, or review it and pass --trust-model-file")


def output_classes(model: nn.Module, channels: int, size: tuple[int, int],
                   which: str | int | None = None) -> int:
    """The class count of a float classifier, from one forward pass on zeros (the output
    ``which`` names when the model returns several, else the first)."""
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(torch.zeros(2, channels, *size))
    except Exception as exc:
        raise ModelSourceError(f"the model does not take ({channels}, {size[0]}, {size[1]}) "
                               f"images: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}; "
                               "check --image-size and --channels") from None
    finally:
        model.train(was)
    out = select(out, which)
    if not isinstance(out, torch.Tensor) or out.ndim != 2:
        raise ModelSourceError("the model must return logits of shape (batch, classes), got "
                               f"{getattr(out, 'shape', type(out).__name__)}; for a detector "
                               "(boxes and class scores) pass --model detect:FILE.py:FACTORY")
    return int(out.shape[1])
