"""TensorRT's QAT recipe, for ``trtqat qat`` and for your own training loop.

TensorRT's guidance for fine-tuning a calibrated model: about 10% of the FP32 schedule's
epochs (at least 1), starting at 1% of the FP32 learning rate, annealed per step with a
cosine down to 1% of that starting rate. The image classifiers' ``trtqat qat`` derives its
defaults from these constants; :func:`qat_recipe` gives the same numbers to any optimizer.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trtqat.runopts import ConfigError

if TYPE_CHECKING:
    import torch

EPOCH_FRACTION = 0.1  # of the FP32 schedule's epochs
LR_FRACTION = 0.01  # of the FP32 learning rate
FINAL_LR_FRACTION = 0.01  # of the QAT starting rate


def qat_epochs(fp32_epochs: int | float, fraction: float = EPOCH_FRACTION) -> int:
    """QAT epochs of an FP32 schedule: ``fraction`` of them, rounded up, at least 1."""
    return max(1, math.ceil(fraction * fp32_epochs))


@dataclass(frozen=True)
class QATRecipe:
    """TensorRT's QAT schedule for your own optimizer and loop.

    ``epochs`` of fine-tuning starting at ``lr`` and cosine-annealed per optimizer step
    down to ``min_lr`` over ``epochs * steps_per_epoch`` steps (no warm-up: the model is
    already trained).

    Example usage::

        recipe = trtqat.qat_recipe(fp32_epochs=90, fp32_lr=0.1, steps_per_epoch=len(loader))
        optimizer = torch.optim.SGD(model.parameters(), lr=recipe.lr, momentum=0.9)
        scheduler = recipe.scheduler(optimizer)
        for epoch in range(recipe.epochs):
            for images, labels in loader:
                loss = criterion(model(images), labels)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                scheduler.step()  # once per step, not per epoch
    """

    epochs: int
    lr: float
    min_lr: float
    steps_per_epoch: int | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.epochs, int) and self.epochs >= 1):
            raise ConfigError(f"QAT epochs must be an int >= 1, got {self.epochs!r}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ConfigError(f"the QAT lr must be a finite number > 0, got {self.lr}")
        if not (math.isfinite(self.min_lr) and 0 <= self.min_lr < self.lr):
            raise ConfigError(f"min_lr ({self.min_lr}) must be >= 0 and below the QAT lr "
                              f"({self.lr})")
        steps = self.steps_per_epoch
        if steps is not None and not (isinstance(steps, int) and steps >= 1):
            raise ConfigError(f"steps_per_epoch must be an int >= 1, got {steps!r} (pass "
                              "len(loader), or None and the total to scheduler())")

    @property
    def final_ratio(self) -> float:
        """``min_lr / lr``: where the cosine ends, as a multiple of the starting rate."""
        return self.min_lr / self.lr

    def total_steps(self, steps_per_epoch: int | None = None) -> int:
        """Optimizer steps of the whole schedule (``steps_per_epoch``: overrides the
        recipe's)."""
        steps = steps_per_epoch or self.steps_per_epoch
        if steps is None or steps < 1:
            raise ConfigError("the cosine needs the steps per epoch: pass steps_per_epoch="
                              "len(loader) to qat_recipe() or to scheduler()")
        return self.epochs * int(steps)

    def lr_lambda(self, steps_per_epoch: int | None = None) -> Callable[[int], float]:
        """The multiplier of ``lr`` at each step (for ``torch.optim.lr_scheduler.LambdaLR``
        or any scheduler that takes one): 1 at step 0, ``final_ratio`` at the last step."""
        from trtqat.runs.loop import cosine_lambda

        return cosine_lambda(self.total_steps(steps_per_epoch), 0, self.final_ratio)

    def lr_at(self, step: int, steps_per_epoch: int | None = None) -> float:
        """The learning rate after ``step`` optimizer steps."""
        return self.lr * self.lr_lambda(steps_per_epoch)(step)

    def scheduler(self, optimizer: torch.optim.Optimizer, steps_per_epoch: int | None = None
                  ) -> torch.optim.lr_scheduler.LambdaLR:
        """A per-step cosine ``LambdaLR`` on ``optimizer``: every parameter group starts at
        :attr:`lr` (also an optimizer that ran the FP32 schedule: its ``initial_lr`` is
        reset). Call ``scheduler.step()`` after every ``optimizer.step()``."""
        import torch

        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"] = self.lr
        return torch.optim.lr_scheduler.LambdaLR(optimizer, self.lr_lambda(steps_per_epoch))


def qat_recipe(fp32_epochs: int, fp32_lr: float, steps_per_epoch: int | None = None, *,
               epochs: int | None = None, lr: float | None = None,
               min_lr: float | None = None) -> QATRecipe:
    """TensorRT's QAT recipe after an FP32 run of ``fp32_epochs`` at ``fp32_lr``: 10% of the
    epochs (at least 1), 1% of the learning rate, cosine per step down to 1% of that.
    ``epochs``, ``lr`` and ``min_lr`` override the derived values (``min_lr`` then defaults
    to 1% of the given ``lr``), as ``trtqat qat``'s options do.

    Example usage::

        recipe = trtqat.qat_recipe(fp32_epochs=90, fp32_lr=0.1, steps_per_epoch=len(loader))
        recipe.epochs, recipe.lr, recipe.min_lr   # (9, 0.001, 1e-05)
        scheduler = recipe.scheduler(optimizer)
    """
    if not (math.isfinite(fp32_epochs) and fp32_epochs > 0):
        raise ConfigError(f"fp32_epochs must be > 0, got {fp32_epochs}")
    if not (math.isfinite(fp32_lr) and fp32_lr > 0):
        raise ConfigError(f"fp32_lr must be a finite number > 0, got {fp32_lr}")
    start = lr or LR_FRACTION * fp32_lr
    return QATRecipe(epochs=epochs or qat_epochs(fp32_epochs), lr=start,
                     min_lr=FINAL_LR_FRACTION * start if min_lr is None else min_lr,
                     steps_per_epoch=steps_per_epoch)


__all__ = ["EPOCH_FRACTION", "FINAL_LR_FRACTION", "LR_FRACTION", "QATRecipe", "qat_epochs",
           "qat_recipe"]
