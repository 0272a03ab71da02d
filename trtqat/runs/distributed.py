"""One process or many: the rank, device and collectives the recipes need.

``torchrun --nproc_per_node=N -m trtqat ...`` sets ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``;
:func:`setup` then joins the process group (nccl on GPU, gloo on CPU). Without them
everything degrades to a single process and the collectives are no-ops.
"""

from __future__ import annotations

import logging
import os
import random
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from trtqat.errors import TrtqatError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistContext:
    """Where this process stands: rank, world size and the device it computes on."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    owns_group: bool = False

    @property
    def distributed(self) -> bool:
        """True when more than one process takes part."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """True on the process that writes files and prints progress (rank 0)."""
        return self.rank == 0


def pick_device(device: str, local_rank: int = 0) -> torch.device:
    """``--device`` (auto, cpu, cuda, cuda:N) as a torch.device; refuses CUDA without a GPU."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise TrtqatError("--device cuda was asked for but no CUDA GPU is visible; "
                              "use --device cpu")
        if device == "cuda":
            device = f"cuda:{local_rank % torch.cuda.device_count()}"
        torch.cuda.set_device(torch.device(device))
    elif device != "cpu":
        raise TrtqatError(f"unknown --device {device!r}: use auto, cpu, cuda or cuda:N")
    return torch.device(device)


def setup(device: str = "auto") -> DistContext:
    """Join the process group if launched by torchrun; returns this process's context."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = pick_device(device, local_rank)
    owns = False
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if dev.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend, rank=rank, world_size=world)
        owns = True
        log.info("rank %d/%d joined the %s process group on %s", rank, world, backend, dev)
    return DistContext(rank=rank, world_size=world, local_rank=local_rank, device=dev,
                       owns_group=owns)


def cleanup(ctx: DistContext) -> None:
    """Leave the process group if :func:`setup` joined it (a no-op for a single process)."""
    if ctx.owns_group and dist.is_initialized():
        dist.destroy_process_group()


def barrier(ctx: DistContext) -> None:
    """Wait until every rank gets here."""
    if ctx.distributed:
        dist.barrier()


def all_reduce_sum(ctx: DistContext, values: torch.Tensor) -> torch.Tensor:
    """Sum ``values`` over ranks (in place) and return it."""
    if ctx.distributed:
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def all_true(ctx: DistContext, flag: bool) -> bool:
    """True only if ``flag`` is true on every rank (so all ranks stop together)."""
    if not ctx.distributed:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item() > 0)


def broadcast_buffers(ctx: DistContext, model: nn.Module) -> None:
    """Give every rank rank 0's buffers (BatchNorm statistics drift apart between syncs)."""
    if ctx.distributed:
        for b in model.buffers():
            dist.broadcast(b, src=0)


def wrap(ctx: DistContext, model: nn.Module) -> nn.Module:
    """``model`` in DistributedDataParallel when distributed, else unchanged."""
    if not ctx.distributed:
        return model
    ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(model, device_ids=ids)


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside a DistributedDataParallel wrapper."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def seed_everything(seed: int, rank: int = 0) -> None:
    """Seed python, numpy and torch; each rank gets its own stream of augmentations."""
    s = seed + rank
    random.seed(s)
    np.random.seed(s % 2**32)
    torch.manual_seed(s)


def rng_state() -> dict:
    """This process's RNG states as plain types and tensors (loadable with weights_only)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "python": list(random.getstate()[1]),
        "python_version": random.getstate()[0],
        "python_gauss": random.getstate()[2],
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore what :func:`rng_state` captured."""
    random.setstate((state["python_version"], tuple(state["python"]), state["python_gauss"]))
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"],
                         n["has_gauss"], n["gauss"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def gather_rng_states(ctx: DistContext) -> list[dict]:
    """Every rank's RNG state, in rank order (so a resumed job restores each rank's own)."""
    state = rng_state()
    if not ctx.distributed:
        return [state]
    states: list = [None] * ctx.world_size
    dist.all_gather_object(states, state)
    return states
