"""The ONNX export of an in-memory Hugging Face encoder (``BertModel``, ``DistilBertModel``,
``RobertaModel``, ``ViTModel``, ...) or other token model (``hf_models`` tells them apart).

Such a model is exported with every 2-D token input (``input_ids``,
``attention_mask``, ``token_type_ids``, ...) dynamic in batch and sequence, every other input
(``pixel_values``) dynamic in batch, its outputs named as the model names them
(``last_hidden_state``, ``pooler_output``), and each float output checked by cosine against
PyTorch on the tokens the attention mask keeps.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import torch
from torch import nn

from trtqat.export import validate as val
from trtqat.export.checks import CheckContext, fidelity_check
from trtqat.export.errors import ExportError
from trtqat.export.onnx_export import ExportPlan
from trtqat.families.encoder.hf_models import forward_params
from trtqat.outputs import flatten
from trtqat.variants import variant as variant_row

BATCH_AXIS, SEQUENCE_AXIS = "batch", "sequence"
TOKEN_TASK = "feature-extraction"     # hidden states: the engines check them by cosine
CLASSIFIER_TASK = "classification"    # a head's logits: the engines check top-1
MASK_INPUT = "attention_mask"


def is_token_input(t: torch.Tensor) -> bool:
    """A tokenizer's tensor: integer (or bool), ``(batch, sequence)``."""
    return t.dim() == 2 and not t.is_floating_point()


def dynamic_shapes(inputs: Sequence[torch.Tensor], max_sequence: int | None
                   ) -> tuple[dict[int, Any], ...]:
    """``torch.export`` dims: batch (shared) for every input, sequence for the token ones."""
    batch = torch.export.Dim(BATCH_AXIS, min=1, max=4096)
    seq = torch.export.Dim(SEQUENCE_AXIS, min=2, max=max_sequence or 4096)
    return tuple({0: batch, 1: seq} if is_token_input(t) else {0: batch} for t in inputs)


def output_names(model: nn.Module, inputs: Sequence[torch.Tensor]) -> list[str]:
    """The model's output names (``last_hidden_state``, ...), from one forward pass (on the
    model's device)."""
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    with torch.no_grad():
        out = model(*(t.to(device) for t in inputs))
    return [name for name, _ in flatten(out)]


def token_checks(variant: str, reference: Any, candidate: Any, context: CheckContext, *,
                 mask_index: int | None = None) -> list[val.Check]:
    """One cosine line per float output: rows over the last axis (a token's hidden state, a
    pooled vector), padding tokens left out where the input ``mask_index`` marks them."""
    tokens = [i for i, t in enumerate(context.batches[0]) if is_token_input(t)] \
        if context.batches else []
    axes = "batch x sequence" if tokens else "batch"
    shapes = [tuple(int(d) for d in b[tokens[0] if tokens else 0].shape[:2 if tokens else 1])
              for b in context.batches]
    checks = []
    for i, name in enumerate(context.names):
        pairs = [(np.asarray(c[i]), np.asarray(r[i])) for c, r in zip(candidate, reference)]
        if not pairs or any(not np.issubdtype(r.dtype, np.floating) or r.ndim == 0
                            for _, r in pairs):
            continue
        bad = sum(int((~np.isfinite(g)).sum()) for g, _ in pairs)  # padding tokens too
        if mask_index is not None:
            pairs = [_kept(g, r, batch[mask_index]) for (g, r), batch
                     in zip(pairs, context.batches)]
        check = fidelity_check(variant, name, pairs, shapes, unit="rows", axes=axes)
        if bad:
            check = val.Check(check.name, False, f"{bad} non-finite value(s) from ONNX Runtime "
                              f"(padding tokens included); {check.detail}")
        checks.append(check)
    if variant_row(variant).qdq and context.traced is not None and context.onnx_path:
        from trtqat.export.qdq_check import check_qdq_inventory

        checks.append(check_qdq_inventory(onnx.load(context.onnx_path), context.traced,
                                          fp16=variant_row(variant).fp16))
    return checks


def _kept(got: np.ndarray, ref: np.ndarray, mask: Any) -> tuple[np.ndarray, np.ndarray]:
    """The token rows of ``(batch, sequence, dim)`` outputs where ``mask`` is set."""
    keep = np.asarray(mask)[:len(ref)].astype(bool)
    if got.shape != ref.shape or ref.ndim != 3 or keep.shape != ref.shape[:2]:
        return got, ref
    return got[keep], ref[keep]


def hf_plan(model: nn.Module, inputs: tuple[torch.Tensor, ...], names: list[str] | None,
            validation: list, limit: int | None) -> ExportPlan:
    """The plan of a Hugging Face (or other token) encoder from its example ``inputs``:
    token inputs dynamic in batch and sequence, the model's output names, :func:`token_checks`.
    ``trtqat.task`` is ``feature-extraction`` (engines then check by cosine), or
    ``classification`` when the first output is a head's ``logits`` (top-1)."""
    names = list(names or forward_params(model)[:len(inputs)])
    if len(names) != len(inputs):
        raise ExportError(f"{type(model).__name__}.forward takes {len(names)} named inputs, "
                          f"the example gives {len(inputs)}: pass a dict by argument name")
    outs = output_names(model, inputs)
    tokens = any(is_token_input(t) for t in inputs)
    mask = names.index(MASK_INPUT) if MASK_INPUT in names else None
    task = CLASSIFIER_TASK if outs[:1] == ["logits"] else TOKEN_TASK
    return ExportPlan(inputs, names, outs, dynamic_shapes=dynamic_shapes(inputs, limit),
                      dynamic_batch=True,
                      dynamic_axes=(BATCH_AXIS, SEQUENCE_AXIS) if tokens else (BATCH_AXIS,),
                      validation=validation, check_example=False,
                      checks=functools.partial(token_checks, mask_index=mask), fold_bn=False,
                      clip_fp16=True,
                      metadata={"trtqat.task": task, "trtqat.inputs": ",".join(names),
                                "trtqat.outputs": ",".join(outs)})


__all__ = ["TOKEN_TASK", "dynamic_shapes", "hf_plan", "is_token_input", "output_names",
           "token_checks"]
