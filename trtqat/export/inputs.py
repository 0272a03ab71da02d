"""Example and validation inputs of an export, as the positional inputs of ``forward``."""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from trtqat.export.errors import ExportError
from trtqat.sizes import check_image_memory

Inputs = tuple[torch.Tensor, ...]


def as_inputs(example_inputs: Any) -> Inputs:
    """A tensor or tuple of tensors as a tuple (float inputs as float32, on the CPU)."""
    inputs = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else tuple(example_inputs)
    if not inputs or not all(isinstance(t, torch.Tensor) for t in inputs):
        raise ExportError("example_inputs must be a tensor, a tuple of tensors or a dict of "
                          "tensors by forward() argument name")
    return tuple((t.float() if t.is_floating_point() else t).detach().cpu() for t in inputs)


def named_inputs(model: nn.Module, example: Any) -> tuple[Inputs, list[str] | None]:
    """``example`` as positional inputs of ``model.forward`` and their names.

    A dict (e.g. a tokenizer's output) is put in ``forward``'s order, its keys becoming the
    ONNX input names; it must give ``forward``'s leading arguments without a gap. A tensor
    or tuple keeps its order (names: None, the exporter's defaults).
    """
    if not isinstance(example, Mapping):
        return as_inputs(example), None
    params = list(inspect.signature(model.forward).parameters)
    unknown = [k for k in example if k not in params]
    if unknown:
        raise ExportError(f"example_inputs holds {unknown[0]!r}, which "
                          f"{type(model).__name__}.forward does not take (it takes "
                          f"{', '.join(params)})")
    names = params[:len(example)]
    if set(names) != set(example):
        missing = next(n for n in names if n not in example)
        raise ExportError(f"example_inputs lacks {missing!r}: {type(model).__name__}.forward "
                          "takes its inputs in the order "
                          f"{', '.join(params)}, so give every one up to the last you give")
    return as_inputs(tuple(example[n] for n in names)), names


def validation_inputs(model: nn.Module, data: Iterable | None) -> list[Inputs]:
    """Validation batches (each ``(inputs, labels)`` or inputs alone: a tensor, a tuple or
    a dict, see :func:`named_inputs`) as positional inputs."""
    out = []
    for batch in data or []:
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        out.append(named_inputs(model, x)[0])
    return out


def check_io_names(input_names: Any, output_names: Any, inputs: int, outputs: list[str]
                   ) -> None:
    """Raise :class:`ExportError` when given ONNX names (``--input-names``,
    ``--output-names``) are not one per input / output of the model."""
    for flag, given, have in (("--input-names", input_names, inputs),
                              ("--output-names", output_names, len(outputs))):
        if given and len(given) != have:
            raise ExportError(f"{flag} gives {len(given)} name(s) ({', '.join(given)}) for a "
                              f"model with {have} {flag[2:-6]}(s); give one name per "
                              f"{flag[2:-6]}, or leave {flag} out")


def make_example_inputs(image_size: int | tuple[int, int], batch: int = 2, channels: int = 3,
                        seed: int = 0) -> torch.Tensor:
    """A reproducible random image batch ``(batch, channels, height, width)`` (an int size
    is square); a batch that would not fit in memory is refused before it is allocated."""
    h, w = (image_size, image_size) if isinstance(image_size, int) else image_size
    check_image_memory(image_size, channels, batch, "the example batch", "--batch/--image-size")
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, channels, h, w, generator=gen)
