"""``--cuda-graphs``: the whole training step (forward, loss, backward, optimizer step) as
one CUDA graph, replayed for every batch.

A host-bound step (a small model or batch, a busy host) spends its time launching hundreds
of small kernels; a replayed graph launches them all at once. What makes the step
replayable:

* the batch is copied into static input buffers, and the step's output and loss are static
  tensors, valid until the next step;
* everything the step updates is updated in place: weights, BatchNorm's running statistics,
  quantizers' amax (buffers; a learned amax is a parameter), the optimizer's state; gradients
  are written (not accumulated) into buffers allocated during the capture;
* the optimizer is fused, with its learning rate a tensor on the device
  (:func:`trtqat.runs.recipes.build_optimizer` with ``graphs=True``): the LR scheduler fills
  that tensor in place, so the captured step follows the schedule without a new capture;
* batches of another shape (the last, partial one) are dropped and counted
  (:meth:`GraphedStep.take_dropped`), never a new capture mid-epoch.

The first :data:`WARMUP_STEPS` batches train eagerly (on a side stream, as capture asks);
the next one is captured, then every batch replays. If the capture fails (an operation
that reads the GPU from the host), the step says why in one warning and stays eager.

``capture=False`` runs the same static-buffer step eagerly: on the CPU it gives the plain
step's results bit for bit, which is how the tests check this module without a GPU.
Refusals (no CUDA, fp16's gradient scaler, ``--compile``, several processes) are
:func:`trtqat.runs.accel.check_cuda_graphs`'s.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

import torch
from torch import nn

log = logging.getLogger(__name__)

WARMUP_STEPS = 3  # eager steps before the capture (lazy initialisation, optimizer state)
_AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def pin_lr(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Make every group's learning rate a 0-d float32 tensor on ``device`` (a resumed
    optimizer's may be a float or a CPU tensor); the scheduler then fills it in place."""
    for group in optimizer.param_groups:
        lr = group["lr"]
        if not (isinstance(lr, torch.Tensor) and lr.device == device and lr.dim() == 0):
            group["lr"] = torch.tensor(float(lr), dtype=torch.float32, device=device)


class GraphedStep:
    """One training step of ``model`` on a batch, captured as a CUDA graph (module doc).

    Call it with a batch ``(x, y)``: returns ``(output, loss)`` (static tensors, valid
    until the next call), or None for a batch of another shape than the first (dropped).
    The caller steps the LR scheduler after each step that returned a result.
    """

    def __init__(self, model: nn.Module, criterion: Callable, optimizer: torch.optim.Optimizer,
                 device: torch.device | str, *, amp: str | None = None,
                 warmup: int = WARMUP_STEPS, capture: bool | None = None) -> None:
        self.model, self.criterion, self.optimizer = model, criterion, optimizer
        self.device = torch.device(device)
        self.amp = amp
        self.warmup = max(1, int(warmup))
        self.capture = self.device.type == "cuda" if capture is None else bool(capture)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.failed: str | None = None  # why the capture failed (the step then stays eager)
        self.static_x: torch.Tensor | None = None
        self.static_y: torch.Tensor | None = None
        self.out: torch.Tensor | None = None
        self.loss: torch.Tensor | None = None
        self.eager_steps = 0
        self.dropped = 0  # samples of dropped batches since the last take_dropped()
        pin_lr(optimizer, self.device)

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.amp is None:
            return contextlib.nullcontext()
        # no cast cache: cached casts would outlive the capture that made them
        return torch.autocast(self.device.type, dtype=_AMP_DTYPES[self.amp],
                              cache_enabled=False)

    def _body(self) -> tuple[torch.Tensor, torch.Tensor]:
        with self._autocast():
            out = self.model(self.static_x)
            loss = self.criterion(out, self.static_y)
        loss.backward()
        self.optimizer.step()
        return out, loss

    def _eager(self) -> tuple[torch.Tensor, torch.Tensor]:
        self.optimizer.zero_grad(set_to_none=True)
        self.eager_steps += 1
        if self.device.type != "cuda":
            return self._body()
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            result = self._body()
        torch.cuda.current_stream(self.device).wait_stream(side)
        return result

    def _capture(self) -> bool:
        self.optimizer.zero_grad(set_to_none=True)  # backward allocates them in the graph
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                out, loss = self._body()
        except Exception as exc:  # noqa: BLE001 - any capture failure: stay eager, say why
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            self.failed = f"{type(exc).__name__}: {first}"
            log.warning("--cuda-graphs: the training step could not be captured (%s); it "
                        "runs eagerly instead", self.failed)
            self.optimizer.zero_grad(set_to_none=True)
            return False
        self.graph, self.out, self.loss = graph, out, loss
        return True

    def __call__(self, x: torch.Tensor, y: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor] | None:
        if self.static_x is None:
            self.static_x = torch.empty_like(x, device=self.device)
            self.static_y = torch.empty_like(y, device=self.device)
        elif x.shape != self.static_x.shape or y.shape != self.static_y.shape:
            self.dropped += int(y.shape[0]) if y.dim() else 1
            return None
        self.static_x.copy_(x, non_blocking=True)
        self.static_y.copy_(y, non_blocking=True)
        if self.graph is None and self.capture and self.failed is None \
                and self.eager_steps >= self.warmup and not self._capture():
            return self._eager()
        if self.graph is not None:
            self.graph.replay()
            return self.out, self.loss
        return self._eager()

    def take_dropped(self) -> int:
        """Samples dropped (batches of another shape) since the last call; resets the count."""
        n, self.dropped = self.dropped, 0
        return n
