"""``--cuda-graphs`` for the image classifiers' ``train`` and ``qat``: the model's checks and
the graphed step (:mod:`trtqat.runs.graphed_step`)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from trtqat.quant.model_ops import quantizers
from trtqat.runs.accel import Accel, AccelError
from trtqat.runs.graphed_step import GraphedStep


def check_graphable(model: nn.Module) -> None:
    """Refuse ``--cuda-graphs`` for a model whose step reads the GPU from the host: quantizers
    still collecting calibration statistics, or unsigned quantizers (they check the sign of
    their input on the host every step)."""
    calib = [n for n, q in quantizers(model) if not q.disabled and q._if_calib]
    if calib:
        raise AccelError(f"--cuda-graphs: {len(calib)} quantizer(s) still collect calibration "
                         f"statistics (e.g. {calib[0]}); finish calibration (compute_amax, or "
                         "`trtqat calibrate`) first, or drop --cuda-graphs")
    unsigned = [n for n, q in quantizers(model) if not q.disabled and q.unsigned
                and q._if_quant]
    if unsigned:
        raise AccelError(f"--cuda-graphs: {len(unsigned)} unsigned quantizer(s) (e.g. "
                         f"{unsigned[0]}) check the sign of their input on the host every "
                         "step, which a CUDA graph cannot; drop --cuda-graphs")


def graphed_step(model: nn.Module, criterion: Callable, optimizer: torch.optim.Optimizer,
                 acc: Accel, *, capture: bool | None = None) -> GraphedStep | None:
    """The :class:`GraphedStep` of ``model`` with ``--cuda-graphs`` (checked), else None."""
    if not acc.cuda_graphs:
        return None
    check_graphable(model)
    return GraphedStep(model, criterion, optimizer, acc.device, amp=acc.amp, capture=capture)
